"""In-memory stand-ins for a connection and the registry, for unit tests of services.

:class:`FakeConnection` has the public API of a real connection but no HTTP
and no Redis: it answers from a queue of replies (a ``str``, a result
``dict``, or an exception instance to raise) and, once the queue is empty,
with the same deterministic echo as the fake provider server. Every call is
appended to ``.calls``. Chats keep an in-memory history, cut to the same
window as a real connection, so ``history()`` and the echo's ``users:`` count
behave as they would against a provider.

``tools=`` and ``tool_outputs=`` are taken as a connection takes them (the
same signatures, checked by the same functions). With no queued reply, a
message ``call NAME {json}`` runs that tool, as the fake provider's model
would ask for it, and answers ``tool said: <output>``; a manual tool
(``function=None``) leaves the chat waiting for ``tool_outputs``.

    llm = FakeRegistry({'My Claude': FakeConnection(['Hello Ann'])})
    service.llm = llm
    ...
    assert llm['My Claude'].calls[0]['chat_id'] == 'user-1'
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from typing import Any, Iterable, Iterator, Mapping

from llmconn import attachments as mod_attachments
from llmconn import items as mod_items
from llmconn import structured
from llmconn import tools as mod_tools
from llmconn.checks import check_chat_id, check_params, check_skill, check_text
from llmconn.errors import InvalidInput, UnknownConnection
from llmconn.providers import PROVIDERS
from llmconn.testing.fake_common import count_words, reply_text, text_chunks
from llmconn.testing.fake_structured import answer as structured_answer
from llmconn.testing.fake_tools import TOOL_ANSWER_PREFIX, requested_calls
# The very conversion a connection applies to tool_outputs (a str, or JSON of any other value).
from llmconn.tool_loop import _output_text as output_text, check_outputs
from llmconn.types import Event

DEFAULT_MAX_HISTORY_TURNS = 20


def _check(text: Any, chat_id: Any, chat_id_required: bool = False, skill: Any = '',
           params: dict | None = None, reserved: frozenset[str] = frozenset(), outputs: Any = None) -> None:
    """The argument checks a real connection makes before any network call: the very same functions."""
    check_chat_id(chat_id, chat_id_required or outputs is not None)
    if outputs is not None:
        check_outputs(text, outputs)
    elif text is not None:
        check_text(text)
    if skill:
        check_skill(skill)
    check_params(params or {}, reserved)


def _tools(tools: Any) -> tuple:
    """``tools=`` checked as a connection checks it (no hosted tools: a fake has no ``hosted_tools``)."""
    if tools is None:
        return ()
    if not isinstance(tools, (list, tuple)):
        raise InvalidInput('tools must be a list of callables or llmconn.Tool objects, e.g. tools=[get_order]')
    return mod_tools.prepare(list(tools))


class FakeConnection:
    """A connection that answers from a queue; see the module docstring."""

    def __init__(self, replies: Iterable[Any] | None = None, name: str = 'fake',
                 max_history_turns: int = DEFAULT_MAX_HISTORY_TURNS, provider: str = 'claude') -> None:
        self.name = name
        # Params the real mapping sets itself, refused as the real connection refuses them.
        self.reserved_params = PROVIDERS[provider].reserved_params
        self.accepts = PROVIDERS[provider].accepts      # and the attachments it takes
        self.max_history_turns = max_history_turns
        self.replies: deque = deque(replies or ())
        self.calls: list[dict] = []
        self.closed = False
        # What ping() returns, or an exception instance it raises.
        self.ping_result: Any = True
        self._chats: dict[str, list[dict]] = {}
        self._pending: dict[str, list[dict]] = {}      # chat id -> tool calls waiting for tool_outputs
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f'<FakeConnection {self.name!r} queued={len(self.replies)} calls={len(self.calls)}>'

    def add_reply(self, *replies: Any) -> None:
        self.replies.extend(replies)

    # The public API of a connection

    def invoke(self, text: str, skill: str = '', tools: Any = None, schema: Any = None,
               attachments: Any = None, **params: Any) -> dict:
        return self._answer('invoke', text, '', skill, params, tools, None, schema, attachments)

    def chat(self, text: str = '', chat_id: str = '', skill: str = '', tools: Any = None,
             tool_outputs: dict | None = None, schema: Any = None, attachments: Any = None,
             **params: Any) -> dict:
        return self._answer('chat', text, chat_id, skill, params, tools, tool_outputs, schema, attachments)

    def stream(self, text: str = '', chat_id: str = '', skill: str = '', tools: Any = None,
               tool_outputs: dict | None = None, schema: Any = None, attachments: Any = None,
               **params: Any) -> Iterator[Event]:
        """Checks and records now; deltas, then one ``done``, as the caller iterates."""
        prepared = self._checked(text, chat_id, skill, params, tools, tool_outputs)
        output = structured.prepare(schema)
        attached = self._attachments(attachments)
        reply = self._record_and_pop('stream', text, chat_id, skill, params, prepared, tool_outputs, attached)
        return self._stream(reply, text, chat_id, skill, prepared, tool_outputs, output)

    def ping(self) -> bool:
        self.calls.append({'method': 'ping', 'text': '', 'chat_id': '', 'skill': '', 'params': {}})
        if isinstance(self.ping_result, BaseException):
            raise self.ping_result
        return self.ping_result

    def history(self, chat_id: str) -> list[dict]:
        _check(None, chat_id, chat_id_required=True)
        with self._lock:
            return [dict(message) for message in self._chats.get(chat_id, ())]

    def delete_history(self, chat_id: str) -> None:
        _check(None, chat_id, chat_id_required=True)
        with self._lock:
            self._chats.pop(chat_id, None)

    def close(self) -> None:
        self.closed = True

    # Internals

    def _checked(self, text: Any, chat_id: Any, skill: Any, params: dict, tools: Any, outputs: Any) -> tuple:
        """Everything a connection checks before its first provider call, manual tools' state included."""
        _check(text, chat_id, skill=skill, params=params, reserved=self.reserved_params, outputs=outputs)
        prepared = _tools(tools)
        with self._lock:
            waiting = [c['call_id'] for c in self._pending.get(chat_id, {}).get('calls', ())] if chat_id else []
        if outputs is None and waiting:
            raise InvalidInput(f'this chat waits for the outputs of tool calls {", ".join(waiting)}; answer them '
                               f'with chat(chat_id=..., tool_outputs={{call_id: output}}) before sending new text')
        if outputs is not None and not waiting:
            raise InvalidInput('tool_outputs given, but this chat has no pending tool calls')
        if outputs is not None and set(outputs) != set(waiting):
            raise InvalidInput(f'tool_outputs must answer exactly the pending call ids {waiting}, '
                               f'got {sorted(outputs)}')
        return prepared

    def _attachments(self, attachments: Any) -> tuple:
        """``attachments=`` checked as a connection with the default ``max_attachment_bytes`` checks it."""
        return mod_attachments.check(attachments, self.name, mod_attachments.DEFAULT_MAX_BYTES, self.accepts)

    def _answer(self, method: str, text: str, chat_id: str, skill: str, params: dict, tools: Any,
                outputs: dict | None, schema: Any = None, attachments: Any = None) -> dict:
        prepared = self._checked(text, chat_id, skill, params, tools, outputs)
        output = structured.prepare(schema)       # checked as a connection checks it
        attached = self._attachments(attachments)
        reply = self._record_and_pop(method, text, chat_id, skill, params, prepared, outputs, attached)
        return self._turn(reply, text, chat_id, skill, prepared, outputs, output)

    def _record_and_pop(self, method: str, text: str, chat_id: str, skill: str, params: dict,
                        tools: tuple = (), outputs: dict | None = None, attached: tuple = ()) -> Any:
        record = {'method': method, 'text': text, 'chat_id': chat_id, 'skill': skill, 'params': dict(params)}
        if attached:
            record['attachments'] = list(attached)
        if tools:           # only when given: a service's test comparing records of plain calls stays as it was
            record['tools'] = [t.name for t in tools]
        if outputs is not None:
            record['tool_outputs'] = dict(outputs)
        with self._lock:
            self.calls.append(record)
            return self.replies.popleft() if self.replies else None

    def _window(self, chat_id: str) -> list[dict]:
        """The stored messages a real connection would send: the last max_history_turns - 1 turns."""
        if not chat_id:
            return []
        keep = 2 * (self.max_history_turns - 1)
        with self._lock:
            messages = self._chats.get(chat_id, [])
            return list(messages[-keep:]) if keep > 0 else []

    def _turn(self, reply: Any, text: str, chat_id: str, skill: str, tools: tuple, outputs: dict | None,
              output: structured.OutputSchema | None = None) -> dict:
        """The result of one call, saved to the chat (a pending turn completed by ``outputs`` replaced)."""
        with self._lock:
            pending = self._pending.pop(chat_id, None) if outputs is not None else None
        if pending is not None:
            text = pending['user']
        refused = ''
        if output is not None and reply is None and not requested_calls(text, [t.name for t in tools]):
            answer, refused = structured_answer(output.schema, text)     # as the fake provider's model answers
            reply = answer or refused
        result = self._result(reply, text, chat_id, skill, tools, pending, outputs)
        if output is not None and result.get('stop_reason') != 'tool_calls' and 'parsed' not in result:
            # The very parse a connection makes: a queued reply that does not fit raises as it would.
            said = mod_items.refusal(refused) if refused else mod_items.text(result['text'])
            result['parsed'] = structured.parse(output, [said], result['text'], self.name)
        if chat_id and result.get('stop_reason') == 'tool_calls':
            with self._lock:
                self._pending[chat_id] = {'user': text, 'calls': result['tool_calls']}
        self._save(chat_id, text, result, replace_last=pending is not None)
        return result

    def _result(self, reply: Any, text: str, chat_id: str, skill: str, tools: tuple = (),
                pending: dict | None = None, outputs: dict | None = None) -> dict:
        if isinstance(reply, type) and issubclass(reply, BaseException):
            reply = reply()
        if isinstance(reply, BaseException):
            raise reply
        window = self._window(chat_id)[:-2] if pending else self._window(chat_id)
        users = [m['content'] for m in window if m['role'] == 'user'] + [text]
        result: dict = {'text': reply if isinstance(reply, str) else reply_text(users, bool(skill))}
        if reply is None and (tools or pending):
            result.update(_tool_answer(text, tools, pending, outputs))
        if isinstance(reply, Mapping):
            result.update(reply)
        result.setdefault('usage', {
            'input_tokens': count_words(skill, text, *(m['content'] for m in window)),
            'output_tokens': count_words(result['text']),
            'cache_read_tokens': 0, 'cache_write_tokens': 0, 'reasoning_tokens': 0,
        })
        result.setdefault('raw', {'fake': True, 'text': result['text']})
        result.setdefault('connection', self.name)      # who answered, as a real connection's result says
        return result

    def _save(self, chat_id: str, text: str, result: dict, replace_last: bool = False) -> None:
        if not chat_id:
            return
        answer = {'role': 'assistant', 'content': result['text']}
        if result.get('tool_calls'):
            answer['tool_calls'] = result['tool_calls']
        with self._lock:
            messages = self._chats.setdefault(chat_id, [])
            if replace_last:
                del messages[-2:]
            messages.extend([{'role': 'user', 'content': text}, answer])

    def _stream(self, reply: Any, text: str, chat_id: str, skill: str, tools: tuple = (),
                outputs: dict | None = None, output: structured.OutputSchema | None = None) -> Iterator[Event]:
        result = self._turn(reply, text, chat_id, skill, tools, outputs, output)
        if result.get('thinking'):
            yield Event('thinking', text=result['thinking'])
        for call in result.get('tool_calls', ()):
            yield Event('tool_call', call={k: call[k] for k in ('call_id', 'name', 'arguments')})
            if 'output' in call:
                yield Event('tool_result', call=call)
        for piece in text_chunks(result['text']):
            yield Event('text', text=piece)
        yield Event('done', result=result)


def _tool_answer(text: str, tools: tuple, pending: dict | None, outputs: dict | None) -> dict:
    """What the fake provider's model makes of ``call NAME {json}``: calls run, or left for the caller."""
    if pending is not None:
        done = [dict(c, output=output_text(outputs[c['call_id']]), is_error=False) for c in pending['calls']]
        return _answered(done, rounds=1)
    by_name = {t.name: t for t in tools}
    calls = [{'call_id': f'call_{uuid.uuid4().hex[:12]}', 'name': name, 'arguments': arguments}
             for name, arguments in requested_calls(text, by_name)]
    if not calls:
        return {'rounds': 1}
    if any(by_name[c['name']].function is None for c in calls):
        return {'text': '', 'tool_calls': calls, 'rounds': 1, 'stop_reason': 'tool_calls'}
    done = [dict(c, **dict(zip(('output', 'is_error'), mod_tools.run(by_name[c['name']], c['name'], c['arguments']))))
            for c in calls]
    return _answered(done, rounds=2)


def _answered(done: list[dict], rounds: int) -> dict:
    return {'text': TOOL_ANSWER_PREFIX + ' | '.join(c['output'] for c in done), 'tool_calls': done, 'rounds': rounds}


class FakeRegistry:
    """Looks up fake connections by name, as a Registry does."""

    def __init__(self, connections: Mapping[str, Any] | None = None) -> None:
        self.connections = dict(connections or {})
        self.closed = False

    def __repr__(self) -> str:
        return f'<FakeRegistry {list(self.connections)}>'

    def __getitem__(self, name: str) -> Any:
        try:
            return self.connections[name]
        except KeyError:
            known = ', '.join(f'"{n}"' for n in self.connections) or 'none are configured'
            raise UnknownConnection(f'no LLM connection named {name!r}; known connections: {known}') from None

    def __contains__(self, name: object) -> bool:
        return name in self.connections

    def __len__(self) -> int:
        return len(self.connections)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self.connections))

    def get(self, name: str, default: Any = None) -> Any:
        return self.connections.get(name, default)

    def close(self) -> None:
        for connection in self.connections.values():
            close = getattr(connection, 'close', None)
            if close is not None:
                close()
        self.closed = True
