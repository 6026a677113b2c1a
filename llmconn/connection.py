"""One configured LLM connection: ``invoke``, ``chat``, ``stream``, ``ping`` and history.

Every provider call goes through one entry, :meth:`Connection.run`, which
takes a :class:`~llmconn.types.CallSpec` and returns the call's events:
``invoke`` and ``chat`` drain them, ``stream`` hands them out, and the
gateway (``llmconn.gateway``) builds a spec of its own conversation and
reads the ``done`` event's result and reply. ``run`` alone does::

    check   (arguments, tools: before any network call)
    count   (in flight for a reload's retire(), observed for metrics and the access log,
             tallied in the usage ledger under the connection, model and gateway key)
    begin   (with a chat id, 1 Redis round trip: take the chat's lock, read the window;
             with a record, record.started(): the gateway's response in_progress)
    (render -> call -> parse -> run tools)*   (the lock is renewed in the background meanwhile)
    save    (1 Redis round trip: append the turn, trim, expire, release;
             with a record, record.ended() - or failed(), or cancelled() - before ``done``)

A spec's ``record`` (:mod:`llmconn.call_record`) is how a caller keeps its
own account of a call in the one pipeline: the gateway's Responses records
(:mod:`llmconn.gateway.recording`) are saved where a chat turn would be,
with the same failure semantics.

and, when the provider fails before anything of its answer was handed on, the
turn fails over to the connection's ``fallbacks`` inside the same begin and
save (:meth:`_answered`, :mod:`llmconn.failover`).

read top-down in :meth:`_pipeline`, :meth:`_turn`, :meth:`_round` and
:meth:`_call`; the transport below does the deadline and the retries.
Everything that can be checked is checked before ``begin``, so bad input
never costs a network call, and a store outage is found before any token
is spent. A turn is saved only after the model's final answer (or, with
manual tools, its calls) is complete, and before ``done`` is handed out; a
failure, a broken stream, a tool loop past ``max_tool_rounds`` or a caller
that stops iterating early saves nothing and frees the lock at once. How
each provider call of a turn is built from the window (a stateful API's
chain included) is the provider's :meth:`~llmconn.providers.base.Provider.chain`;
a caller that keeps the chain itself gives it in the spec.
"""

from __future__ import annotations

import time as mod_time
from dataclasses import dataclass, field, replace
from typing import Any, Iterator

from llmconn import attachments as mod_attachments
from llmconn import call_record
from llmconn import failover
from llmconn import items as mod_items
from llmconn import structured
from llmconn import tools as mod_tools
from llmconn import observe
from llmconn.checks import MAX_CHAT_ID_CHARS, MAX_TEXT_CHARS, check_params, check_skill  # noqa: F401
from llmconn.checks import check_chat_id as _check_chat_id
from llmconn.checks import check_text as _check_text
from llmconn.compaction import Compacted, compact, summarizer_of, summary_block, system_with
from llmconn.config import ConnectionConfig
from llmconn.errors import InactiveConnection, InvalidInput, LLMError, LLMRateLimited, ToolLoopLimit
from llmconn.lifetime import Counted, InFlight
from llmconn.providers import PROVIDERS
from llmconn.providers.base import STREAM, STRUCTURED, SYSTEM, TOOLS, Chain
from llmconn.providers.caching import chat_cache_key
from llmconn.skills import SkillCache
from llmconn.text import clean, clean_value
from llmconn.transport import Transport
from llmconn.tool_loop import TurnLoop, check_outputs, check_pending, public_call
from llmconn.types import CallSpec, Event, Reply, Request, Turn, drain
from llmconn.usage import NO_LEDGER

PING_TEXT = 'ping'              # what ping() asks a server that has no model list
_NOT_COMPACTED = Compacted()    # what most calls send: no summary (read, never changed)


@dataclass
class _Call:
    """One call's checked spec, and what the checks made of it."""

    spec: CallSpec
    system: str = ''
    summary: str = ''               # the compaction summary ``system`` ends with
    tools: tuple = ()
    hosted: tuple = ()
    by_name: dict = field(default_factory=dict)
    schema: structured.OutputSchema | None = None
    attachments: tuple = ()
    answers: list = field(default_factory=list)    # each round's Reply so far (a record's cancel sums them)


class Connection:
    """A named provider connection with its HTTP pool and access to the chat store."""

    def __init__(self, conf: ConnectionConfig, store, skills: SkillCache, transport: Transport | None = None,
                 usage=None) -> None:
        self.conf = conf
        self.name = conf.name
        self.provider = PROVIDERS[conf.provider](conf)
        self.store = store
        self.skills = skills
        self.transport = transport or Transport(conf.name, pool_size=conf.pool_size, timeout=conf.timeout,
                                                max_retries=conf.max_retries, secret=conf.secret_value,
                                                address=conf.address, stream_timeout=conf.stream_timeout)
        self._headers = self.provider.headers()
        self.usage = usage or NO_LEDGER      # counts every call, see llmconn.usage
        self.calls = InFlight()         # running calls: a connection a reload replaced closes after the last
        self.closed = False
        self.peers: dict = {}           # the registry's connections by name (a compaction's summarizer)

    def __repr__(self) -> str:
        return f'<Connection {self.name!r} provider={self.conf.provider} model={self.conf.model}>'

    # -- public API ------------------------------------------------------------------------------

    def invoke(self, text: str, skill: str = '', tools: Any = None, schema: Any = None,
               attachments: Any = None, **params: Any) -> dict:
        """One-shot call: no history is read, written or locked.

        ``schema=`` (a pydantic model class or a JSON Schema dict) asks for an answer in it: the
        result's ``parsed`` holds it, validated (see :mod:`llmconn.structured`). ``attachments=``
        (:class:`llmconn.Attachment` objects) go with the text (see :mod:`llmconn.attachments`).
        """
        return self._drain(self.run(CallSpec(text, skill=skill, params=params, tools=tools, schema=schema,
                                             attachments=attachments)))

    def chat(self, text: str = '', chat_id: str = '', skill: str = '', tools: Any = None,
             tool_outputs: dict | None = None, schema: Any = None, attachments: Any = None,
             **params: Any) -> dict:
        """A call that continues the conversation ``chat_id``; without one it is exactly ``invoke``.

        ``tool_outputs={call_id: output}`` (and no text) answers a turn left pending by manual tools.
        """
        return self._drain(self.run(CallSpec(text, chat_id, skill, params, tools=tools, outputs=tool_outputs,
                                             schema=schema, attachments=attachments)))

    def stream(self, text: str = '', chat_id: str = '', skill: str = '', tools: Any = None,
               tool_outputs: dict | None = None, schema: Any = None, attachments: Any = None,
               **params: Any) -> Iterator[Event]:
        """Like ``chat``, but yields ``thinking`` / ``text`` deltas, ``tool_call`` / ``tool_result``
        events and one final ``done``."""
        if STREAM not in self.provider.capabilities:
            raise InvalidInput(f'{self.name}: provider {self.conf.provider} does not support the capability '
                               f'"{STREAM}"; use chat() instead')
        return self.run(CallSpec(text, chat_id, skill, params, True, tools, tool_outputs, schema=schema,
                                 attachments=attachments))

    def run(self, spec: CallSpec) -> Iterator[Event]:
        """The one entry of every provider call: check ``spec`` now, then return its lazy events.

        Bad input raises here, before any network call. The events end with
        one ``done`` (its ``result`` the dict ``invoke`` returns, its ``reply``
        the last provider answer); the call counts as in flight until they
        end, however they end (exhausted, failed, closed or collected), and is
        observed and counted in the usage ledger (under ``spec.key_id``). A
        ``stream`` spec on a provider that cannot stream gets the whole answer
        as deltas. A ``spec.record`` is told of the call where a chat would be
        begun and saved (:func:`llmconn.call_record.recorded`); one that refuses
        to start leaves nothing sent and nothing counted.
        """
        call = self._checked(spec)
        tally = self.usage.call(self.name, self.conf.model, spec.key_id)
        events = observe.call(self.name, tally.track(self._pipeline(call, tally)))
        if spec.record is not None:     # outermost: a record that refuses the call leaves nothing to count
            events = call_record.recorded(spec.record, events, call.answers)
        return Counted(events, self.calls)

    def ping(self) -> bool:
        """True when the provider answers; raises LLMError otherwise.

        Asks for the model list, which costs no tokens; a server that has none
        (404 or 405: some compatible servers and gateways) is asked a one-word question.
        A health check, not a call: it counts in flight, but not in the usage ledger or the
        call metrics (its HTTP attempts are in the provider metrics as every attempt is).
        """
        self._check_active()
        with self.calls:
            return self._ping()

    def _ping(self) -> bool:
        url = self.provider.ping_url()
        try:
            if url:
                self.transport.get(url, self._headers)
                return True
        except LLMError as e:
            if e.status not in (404, 405):
                raise
        # fallbacks=(): a ping asks this provider, never another one.
        self._drain(self._pipeline(_Call(CallSpec(PING_TEXT, fallbacks=())), NO_LEDGER.call(self.name, self.conf.model)))
        return True

    def history(self, chat_id: str) -> list[dict]:
        """Every stored message of the chat, oldest first, as ``{"role", "content"}``."""
        _check_chat_id(chat_id, required=True)
        messages = []
        with self.calls:
            turns = self.store.history(self.name, chat_id)
        for turn in turns:
            # clean(): a turn stored before text was cleaned may hold a lone surrogate.
            asked = {'role': 'user', 'content': clean(turn.user)}
            if turn.attachments:
                asked['attachments'] = [dict(a.meta()) for a in turn.attachments]
            messages.append(asked)
            said = {'role': 'assistant', 'content': clean(turn.assistant)}
            calls = mod_items.tool_calls(turn.steps()) if turn.items else []
            if calls:
                said['tool_calls'] = clean_value(calls)
            messages.append(said)
        return messages

    def delete_history(self, chat_id: str) -> None:
        _check_chat_id(chat_id, required=True)
        with self.calls:
            self.store.delete(self.name, chat_id)

    def close(self) -> None:
        self.closed = True
        self.transport.close()

    def retire(self, then=None) -> None:
        """Close once the calls running now have finished, then run ``then`` (see :mod:`llmconn.lifetime`)."""
        def close_then() -> None:
            self.close()
            if then is not None:
                then()
        self.calls.retire(close_then)

    # -- the pipeline ----------------------------------------------------------------------------

    def _checked(self, spec: CallSpec) -> _Call:
        """Everything about a call that can be known before the network, checked (InvalidInput)."""
        self._check_active()
        _check_chat_id(spec.chat_id, required=spec.outputs is not None)
        if spec.chat_id and (spec.history or spec.items or spec.chain):
            raise InvalidInput('a call continues either a stored chat (chat_id) or the caller\'s own '
                               'conversation (history, items), not both')
        if spec.outputs is not None:
            check_outputs(spec.text, spec.outputs)
        elif spec.text or not spec.items:       # a turn in progress may go on without new text
            _check_text(spec.text)
        check_params(spec.params, self.provider.reserved_params)
        call = _Call(spec, system=self._system(spec.skill, spec.system))
        self._check_tools(call, spec.tools)
        call.schema = self._check_schema(spec.schema)
        call.attachments = self._check_attachments(spec)
        return call

    def _pipeline(self, call: _Call, tally) -> Iterator[Event]:
        spec = call.spec
        if not spec.chat_id:
            by, answered, loop = yield from self._answered(call, list(spec.history), None, tally)
            yield Event('done', result=by._result(answered, loop), reply=loop.last)
            return
        conf = self.conf
        # The lock is released on every way out; if that release fails while another error is
        # already on its way out, the store logs it rather than hide the first error.
        with self.store.begin(self.name, spec.chat_id, window=conf.max_history_turns - 1,
                              lock_ttl=conf.lock_ttl, lock_wait=conf.lock_wait, window_step=conf.window_step) as lock:
            window = list(lock.turns)
            pending = window.pop() if window and window[-1].pending else None
            check_pending(pending, spec)
            compacted = self._compact(spec.chat_id, window, pending)
            call.system = system_with(call.system, compacted.summary)
            call.summary = summary_block(compacted.summary)
            by, answered, loop = yield from self._answered(call, window, pending, tally)
            result = by._result(answered, loop)
            if compacted.usage is not None:
                result['usage']['compaction'] = compacted.usage
            items = loop.stored_items()
            # A fallback's turn is saved in this chat: its natives tagged as its own (replayed only to
            # it), and without its provider-side state (a chain another provider cannot continue).
            lock.save(Turn(user=pending.user if pending else spec.text, assistant=loop.text,
                           attachments=pending.attachments if pending else call.attachments,
                           items=items, tag=by.provider.tag if items else '',
                           state=loop.state if by is self else {}, ts=mod_time.time(), meta=loop.last.meta,
                           summary=compacted.summary if compacted.made else {}),
                      expiry=conf.chat_expiry, max_turns=conf.max_stored_turns, replace_last=pending is not None,
                      counters=tally.save_entry(self.name, spec.chat_id, result, lock))
            tally.saved()
            yield Event('done', result=result, reply=loop.last)

    def _compact(self, chat_id: str, window: list[Turn], pending: Turn | None) -> Compacted:
        """The summary of what the window left behind, made now if its start just moved (see
        :mod:`llmconn.compaction`); none without ``compaction``, or while a turn waits for tool outputs."""
        if self.conf.compaction is None or pending is not None:
            return _NOT_COMPACTED
        return compact(self.conf, window, lambda: self.store.history(self.name, chat_id),
                       summarizer_of(self.conf, self.peers))

    def _answered(self, call: _Call, window: list[Turn], pending: Turn | None, tally) -> Iterator[Event]:
        """The turn, answered by this connection or by the fallback it failed over to.

        Returns ``(connection, its checked call, the TurnLoop)`` of the one that answered. A turn
        fails over only while nothing of it happened: no event handed on, no round answered (its
        tools would run twice), no provider-side chain given (see :mod:`llmconn.failover`).
        """
        spec = call.spec
        if spec.chain or not (self.conf.fallbacks if spec.fallbacks is None else spec.fallbacks):
            loop = yield from self._turn(call, window, pending, tally, self._loop(call, pending))
            return self, call, loop
        plan = iter(failover.plan(self.name, self._fallbacks_of, spec.fallbacks))
        conn, current, held = self, call, None
        waits: list[float] = []     # the Retry-After of each rate-limited connection: the error says the least
        try:
            while True:
                loop = conn._loop(current, pending)
                events = conn._turn(current, window, pending, tally, loop)
                started = False
                try:
                    for event in events:
                        started = True
                        yield event
                    return conn, current, loop
                except LLMError as e:
                    why = failover.reason(e)
                    taken = None if started or loop.rounds or not why else self._fallback(plan, conn, current,
                                                                                           why, tally)
                    if isinstance(e, LLMRateLimited) and e.retry_after is not None:
                        waits.append(e.retry_after)
                    if taken is None:
                        if conn is not self:        # no one answered: the call failed as the primary's
                            tally.counted_under(self.usage.prefix(self.name, self.conf.model, spec.key_id))
                        if isinstance(e, LLMRateLimited) and waits:
                            e.retry_after = min(waits)      # the soonest any connection of the plan may answer
                        raise
                finally:
                    events.close()      # a caller that stopped reading closes the provider's stream now
                if held is not None:
                    held.__exit__(None, None, None)
                    held = None
                conn, current = taken
                # A provider-side chain is its own connection's: the fallback is sent the window itself.
                window = [replace(t, state={}) if t.state else t for t in window]
                pending = replace(pending, state={}) if pending is not None and pending.state else pending
                held = conn.calls.__enter__()       # in flight on the fallback too, for its reload's retire()
        finally:
            if held is not None:
                held.__exit__(None, None, None)

    def _fallback(self, plan: Iterator[str], failed: 'Connection', call: _Call, why: str,
                  tally) -> tuple['Connection', _Call] | None:
        """The next connection of ``plan`` that can take ``call`` over, and the call as it checked it."""
        spec = call.spec
        for name in plan:
            fallback = self.peers.get(name)
            if fallback is None or fallback.store is not self.store:
                failover.skipped(failed.name, name, 'it is not a connection of this configuration now')
                continue
            try:
                taken = fallback._checked(spec)
            except (InvalidInput, InactiveConnection) as e:
                failover.skipped(failed.name, name, str(e))
                continue
            taken.system, taken.summary = call.system, call.summary     # the skill's, and the chat's summary
            taken.answers = call.answers
            failover.failed_over(failed.name, name, why)
            observe.failover(failed.name, name, why)
            tally.failed_over(self.usage.prefix(name, fallback.conf.model, spec.key_id))
            if spec.on_failover is not None:
                spec.on_failover(fallback)
            return fallback, taken
        return None

    def _fallbacks_of(self, name: str) -> tuple:
        peer = self.peers.get(name)
        return peer.conf.fallbacks if peer is not None else ()

    def _loop(self, call: _Call, pending: Turn | None) -> TurnLoop:
        spec = call.spec
        return TurnLoop(pending, spec.outputs, self.provider.tag, given=spec.items, given_tag=spec.tag,
                        pricing=self.conf.pricing)

    def _turn(self, call: _Call, window: list[Turn], pending: Turn | None, tally, loop: TurnLoop) -> Iterator[Event]:
        """The tool loop: call, parse, run the tools the model asked for, until it answers.

        Each answered round is told to ``tally``: its tokens count even if a later round fails.
        """
        spec = call.spec
        # A chain the caller keeps (the gateway's previous_response_id) is sent as given, never re-derived.
        chain = Chain(window) if spec.chain else self.provider.chain(window)
        base = Request(pending.user if pending else spec.text, call.system, (), spec.params, spec.stream,
                       tools=call.tools, hosted=call.hosted, chain=spec.chain, tag=self.provider.tag,
                       stateless=spec.stateless, cache_key=chat_cache_key(self.name, spec.chat_id),
                       summary=call.summary, schema=call.schema, attachments=call.attachments)
        while True:
            if loop.rounds >= self.conf.max_tool_rounds:
                raise ToolLoopLimit(f'{self.name}: the model still asked for tools after {loop.rounds} provider '
                                    f'calls (max_tool_rounds); nothing was saved. Raise max_tool_rounds or '
                                    f'check what the tools answer')
            reply = yield from self._round(chain, chain.request(base, loop.items, loop.last), spec.stream)
            tally.answered(reply)
            call.answers.append(reply)
            loop.add(reply, chain.state(reply))
            calls = reply.calls
            if spec.stream:
                for item in calls:
                    yield Event('tool_call', call=public_call(item))
            if not calls:
                return loop
            if not spec.run_tools:
                loop.waiting = True     # the caller runs every tool (the gateway's clients)
                return loop
            if loop.rounds >= self.conf.max_tool_rounds:
                continue        # raises above, before any tool runs for nothing
            yield from self._run_tools(call, loop, calls)
            if loop.waiting:
                return loop

    def _result(self, call: _Call, loop: TurnLoop) -> dict:
        """The call's result; with a schema, its final answer parsed (StructuredOutputError: nothing saved)."""
        result = loop.result
        result['connection'] = self.name        # who answered: a fallback's name when the call failed over
        if call.schema is not None and not loop.waiting:
            result['parsed'] = structured.parse(call.schema, loop.items, loop.text, self.name, loop.last.raw)
        return result

    def _run_tools(self, call: _Call, loop: TurnLoop, calls: list[dict]) -> Iterator[Event]:
        for item in calls:
            tool = call.by_name.get(item['name'])
            if tool is not None and tool.function is None:
                loop.waiting = True     # a manual tool: the caller gives its output later
                continue
            output, is_error = mod_tools.run(tool, item['name'], item['arguments'], self.conf.tool_timeout)
            loop.items.append(mod_items.output(item['call_id'], output, is_error))
            if call.spec.stream:
                yield Event('tool_result', call=dict(public_call(item), output=output, is_error=is_error))

    def _round(self, chain, request: Request, stream: bool) -> Iterator[Event]:
        """One provider call; a chain that fails in a way it can recover from is retried once,
        if nothing of the failed answer was handed on yet."""
        started = False
        events = self._call(request)
        try:
            while True:
                event = next(events)
                started = True
                yield event
        except StopIteration as stop:
            return stop.value
        except LLMError as e:
            # Only an answer that failed before any of it reached the caller can be asked again.
            retry = None if started else chain.recover(e, request)
            if retry is None:
                raise
        return (yield from self._call(retry))

    def _call(self, request: Request) -> Iterator[Event]:
        if request.stream and STREAM in self.provider.capabilities:
            return (yield from self._streamed(request))
        reply = self._answer(replace(request, stream=False) if request.stream else request)
        if request.stream:      # a provider that cannot stream: its whole answer is handed on as deltas
            if reply.thinking:
                yield Event('thinking', text=reply.thinking)
            if reply.text:
                yield Event('text', text=reply.text)
        return reply

    def _answer(self, request: Request) -> Reply:
        provider = self.provider
        body = provider.build_request(request)
        if provider.raw_answers:
            answer = self.transport.exchange(provider.http_method, provider.url(), self._headers, body)
        else:
            answer = self.transport.post(provider.url(stream=False), self._headers, body)
        return provider.done(provider.parse_response(answer))

    def _streamed(self, request: Request) -> Iterator[Event]:
        provider, reply = self.provider, None
        body = provider.build_request(request)
        for event in provider.read_stream(self.transport.post_stream(provider.url(stream=True), self._headers, body)):
            if isinstance(event, Reply):
                reply = event
            else:
                yield event
        if reply is None:
            raise LLMError(f'{self.name}: the provider\'s answer ended without a result', connection=self.name)
        return reply

    # -- checks ----------------------------------------------------------------------------------

    def _check_active(self) -> None:
        if not self.conf.is_active:
            raise InactiveConnection(f'connection "{self.name}" is not active; set is_active: true in its '
                                     f'configuration to use it')

    def _system(self, skill: str, given: str = '') -> str:
        """The call's system prompt: the caller's own, or the skill's instructions."""
        if not skill and not given:
            return ''
        if skill:
            check_skill(skill)
        if SYSTEM not in self.provider.capabilities:
            raise InvalidInput(f'{self.name}: provider {self.conf.provider} does not support the capability '
                               f'"{SYSTEM}" that {"skills need" if skill else "a system prompt needs"}')
        return given or self.skills.get(skill).instructions

    def _check_tools(self, call: _Call, tools: Any) -> None:
        if tools is None:
            call.hosted = call.spec.hosted
            return
        if TOOLS not in self.provider.capabilities:
            raise InvalidInput(f'{self.name}: provider {self.conf.provider} does not support the capability '
                               f'"{TOOLS}"; call it without tools=')
        if not isinstance(tools, (list, tuple)):
            raise InvalidInput('tools must be a list of callables or llmconn.Tool objects, e.g. tools=[get_order]')
        hosted = [t for t in tools if isinstance(t, dict)]
        call.hosted = call.spec.hosted + mod_tools.check_hosted(hosted, self.conf.hosted_tools)
        call.tools = mod_tools.prepare([t for t in tools if not isinstance(t, dict)])
        call.by_name = {t.name: t for t in call.tools}

    def _check_schema(self, schema: Any) -> structured.OutputSchema | None:
        if schema is not None and STRUCTURED not in self.provider.capabilities:
            raise InvalidInput(f'{self.name}: provider {self.conf.provider} does not support the capability '
                               f'"{STRUCTURED}"; call it without schema=')
        return structured.prepare(schema)

    def _check_attachments(self, spec: CallSpec) -> tuple:
        if spec.attachments is not None and spec.outputs is not None:
            raise InvalidInput('attachments go with a new message, not with tool_outputs; send them in the '
                               'next chat() call')
        return mod_attachments.check(spec.attachments, self.name, self.conf.max_attachment_bytes,
                                     self.provider.accepts)

    @staticmethod
    def _drain(events: Iterator[Event]) -> dict:
        return drain(events).result
