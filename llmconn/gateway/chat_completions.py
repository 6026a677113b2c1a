"""``POST /v1/chat/completions``: its own contract, stateless, never an alias of Responses.

Function tools go to the backend as manual tools; its calls come back as
the assistant message's ``tool_calls`` (``finish_reason: tool_calls``), and
the client answers them with ``role: tool`` messages in its next request,
which carries the whole conversation (joined to the calls by id, strictly,
before dispatch). Nothing of a completion is stored but, under standard
retention, the provider items its tool calls need replayed
(:mod:`llmconn.gateway.call_registry`); its usage counts in the usage
ledger under the connection and the gateway key, as every call does. Streams are ``chat.completion.chunk``
objects ending in ``data: [DONE]``; ``stream_options.include_usage`` adds
the final chunk with ``choices: []`` and the usage, as OpenAI does. A
stream the client leaves is counted ``cancelled`` with the output tokens
estimated from the text it streamed (marked so in the log), as the
Responses route records them.
"""

from __future__ import annotations

import itertools
import logging
import os
import time as mod_time
from dataclasses import dataclass, field
from typing import Any, Iterator

from llmconn.call_record import estimated_usage
from llmconn.errors import GatewayError, LLMConnError, StoreError
from llmconn.gateway import backend, call_registry, fallbacks, items as mod_items, limits, tools as mod_tools
from llmconn.gateway.capabilities import CHAT
from llmconn.gateway.echo import bounded
from llmconn.gateway.policy import Policy, resolve
from llmconn.gateway.responses import DOWNGRADES_KEY
from llmconn.gateway.stream import ChatChunks, chat_sse
from llmconn.gateway.turns import to_conversation

logger = logging.getLogger('llmconn.gateway')

_FINISH = {'completed': 'stop', 'incomplete': 'length'}


@dataclass
class ChatCall:
    key: Any
    conn: Any
    model: str
    stream: bool
    include_usage: bool
    conversation: mod_items.Conversation
    params: dict
    downgrades: list
    tools: tuple = ()
    hosted: tuple = ()
    id: str = field(default_factory=lambda: 'chatcmpl-' + os.urandom(16).hex())     # secrets.token_hex's bytes
    created: int = field(default_factory=lambda: int(mod_time.time()))
    fallbacks: tuple = ()           # the connections that may take it over (llmconn.gateway.fallbacks)
    served: Any = None              # the fallback that answered, once one took the call over
    admission: Any = None           # the key's limits (llmconn.gateway.limits), None for a key without

    @property
    def answering(self) -> Any:
        """The connection answering: ``conn``, or the fallback the call failed over to."""
        return self.served or self.conn

    def failed_over(self, fallback: Any) -> None:
        self.served = fallback

    def extra(self) -> dict:
        """What the gateway adds to the completion: the downgrades it accepted and the fallback that
        answered, if any."""
        metadata = {DOWNGRADES_KEY: ','.join(self.downgrades)} if self.downgrades else {}
        if self.served is not None:
            metadata[fallbacks.SERVED_BY_KEY] = self.served.name
        return {'metadata': metadata} if metadata else {}


def prepare(gw: Any, key: Any, body: Any, admission: Any = None) -> ChatCall:
    """Check a completion request whole, before any network call, and resolve it into a :class:`ChatCall`
    (counted against ``admission``, the key's limits, when it has them)."""
    if not isinstance(body, dict):
        raise GatewayError('the request body must be a JSON object')
    model = body.get('model')
    conn = gw.connection(key, model)
    tools, hosted = mod_tools.definitions(key, conn, body.get('tools'), chat=True)
    policy = Policy.parse(body.get('fallback_policy'))
    resolution = resolve(CHAT, backend.kind(conn), body, policy)
    stream = body.get('stream') or False
    options = body.get('stream_options') or {}
    if not isinstance(stream, bool) or not isinstance(options, dict):
        raise GatewayError('stream must be true or false and stream_options an object', param='stream')
    said = call_registry.restore(gw, key, mod_items.from_chat_messages(body.get('messages')))
    conversation = to_conversation(said, '', policy, resolution)
    if resolution.downgrades:
        logger.info('Downgrade accepted: tenant=%s key=%s model=%s losses=%s', key.tenant, key.id, model,
                    ','.join(resolution.downgrades))
    call = ChatCall(key, conn, model, stream, bool(options.get('include_usage')), conversation,
                    resolution.params, resolution.downgrades, tools, hosted, admission=admission)
    call.fallbacks = fallbacks.usable(conn, lambda fallback: _can_take(key, fallback, body, policy, resolution, call))
    return call


def _can_take(key: Any, fallback: Any, body: dict, policy: Policy, resolution: Any, call: ChatCall) -> None:
    """Raise unless ``fallback`` can answer ``call`` as its connection would (llmconn.gateway.fallbacks)."""
    fallbacks.same_call(resolution, resolve(CHAT, backend.kind(fallback), body, policy))
    backend.check_replay(fallback, call.conversation)
    if call.hosted and mod_tools.definitions(key, fallback, body.get('tools'), chat=True)[1] != call.hosted:
        raise GatewayError('it does not run the same hosted tools')


def _events(call: ChatCall) -> Iterator:
    # Stateless all the way: a backend that would keep the exchange (Responses, state: provider) is told not to.
    return backend.events(call.conn, call.conversation, call.params, call.stream, store=False,
                          key_id=call.key.id, tools=call.tools, hosted=call.hosted, fallbacks=call.fallbacks,
                          on_failover=call.failed_over)


def _finish_reason(status: str, calls: list) -> str:
    return 'tool_calls' if calls and status == 'completed' else _FINISH[status]


def _usage(reply: Any) -> dict:
    return {'prompt_tokens': reply.input_tokens, 'completion_tokens': reply.output_tokens,
            'total_tokens': reply.input_tokens + reply.output_tokens,
            'prompt_tokens_details': {'cached_tokens': reply.cache_read_tokens,
                                      'cache_write_tokens': reply.cache_write_tokens},
            'completion_tokens_details': {'reasoning_tokens': reply.reasoning_tokens}}


def complete(gw: Any, call: ChatCall) -> dict:
    events = _events(call)      # checked now; the backend is reached below
    reply = backend.answer(events)
    limits.spent(call.admission, call.answering, reply.usage)     # a fallback priced as itself
    status, _ = backend.finish(call.answering, reply.raw)
    calls = _remember(gw, call, reply)
    message: dict = {'role': 'assistant', 'content': reply.text or (None if calls else ''), 'refusal': None}
    if reply.thinking:
        message['reasoning_content'] = reply.thinking
    if calls:
        message['tool_calls'] = [mod_tools.chat_tool_call(c) for c in calls]
    finish = _finish_reason(status, calls)
    return {'id': call.id, 'object': 'chat.completion', 'created': call.created, 'model': call.model,
            'choices': [{'index': 0, 'message': message, 'finish_reason': finish, 'logprobs': None}],
            'usage': _usage(reply), **call.extra()}


def stream(gw: Any, call: ChatCall) -> Iterator[bytes]:
    events = _events(call)
    first = next(events)
    return _body(gw, call, ChatChunks(call.id, call.created, call.model, call.include_usage),
                 itertools.chain([first], events), events)


def _body(gw: Any, call: ChatCall, chunks: ChatChunks, events: Iterator, provider: Any) -> Iterator[bytes]:
    ended = False
    try:
        for chunk in chunks.start():
            yield chat_sse(chunk)
        for event in events:
            if event.type != 'done':
                for chunk in chunks.feed(event.type, event.text):
                    yield chat_sse(chunk)
                continue
            ended = True
            limits.spent(call.admission, call.answering, event.reply.usage)
            status, _ = backend.finish(call.answering, event.reply.raw)
            calls = _remember(gw, call, event.reply)
            for chunk in chunks.finish(event.reply.text, _finish_reason(status, calls), _usage(event.reply),
                                       call.extra(), calls):
                yield chat_sse(chunk)
            return
    except LLMConnError as e:
        ended = True
        # Chat Completions has no failure event: OpenAI sends an error object in the stream and stops.
        yield chat_sse({'error': {'message': bounded(str(e)), 'type': 'server_error', 'param': None, 'code': None}})
    finally:
        provider.close()
        if not ended:
            logger.info('Completion %s cancelled by the client after %d streamed characters; its usage is '
                        'estimated', call.id, chunks.streamed_chars)
            # Its call counts as cancelled in the ledger; the tokens it streamed are only estimated here,
            # and count so against the key's tpm and budget too.
            usage = estimated_usage(chunks.streamed_chars)
            limits.spent(call.admission, call.answering, usage)
            gw.registry.usage.add_estimate(call.answering.name, call.answering.conf.model, call.key.id, usage)


def _remember(gw: Any, call: ChatCall, reply: Any) -> list:
    """The answer's calls; what a replay of them needs is kept for the client's next request."""
    steps = backend.steps(reply)
    try:
        call_registry.remember(gw, call.key, steps, call.answering.provider.tag)
    except StoreError as e:
        logger.error('Could not keep the provider items behind the tool calls of a completion of %s: %s',
                     call.model, e)
    return backend.calls(steps)

