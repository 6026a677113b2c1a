"""In-memory stand-ins for a connection and the registry, for unit tests of services.

:class:`FakeConnection` has the public API of a real connection but no HTTP
and no Redis: it answers from a queue of replies (a ``str``, a result
``dict``, or an exception instance to raise) and, once the queue is empty,
with the same deterministic echo as the fake provider server. Every call is
appended to ``.calls``. Chats keep an in-memory history, cut to the same
window as a real connection, so ``history()`` and the echo's ``users:`` count
behave as they would against a provider.

    llm = FakeRegistry({'My Claude': FakeConnection(['Hello Ann'])})
    service.llm = llm
    ...
    assert llm['My Claude'].calls[0]['chat_id'] == 'user-1'
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any, Iterable, Iterator, Mapping

from llmconn.checks import check_chat_id, check_params, check_skill, check_text
from llmconn.errors import UnknownConnection
from llmconn.providers import PROVIDERS
from llmconn.testing.fake_common import count_words, reply_text, text_chunks
from llmconn.types import Event

DEFAULT_MAX_HISTORY_TURNS = 20


def _check(text: Any, chat_id: Any, chat_id_required: bool = False, skill: Any = '',
           params: dict | None = None, reserved: frozenset[str] = frozenset()) -> None:
    """The argument checks a real connection makes before any network call: the very same functions."""
    if text is not None:
        check_text(text)
    check_chat_id(chat_id, chat_id_required)
    if skill:
        check_skill(skill)
    check_params(params or {}, reserved)


class FakeConnection:
    """A connection that answers from a queue; see the module docstring."""

    def __init__(self, replies: Iterable[Any] | None = None, name: str = 'fake',
                 max_history_turns: int = DEFAULT_MAX_HISTORY_TURNS, provider: str = 'claude') -> None:
        self.name = name
        # Params the real mapping sets itself, refused as the real connection refuses them.
        self.reserved_params = PROVIDERS[provider].reserved_params
        self.max_history_turns = max_history_turns
        self.replies: deque = deque(replies or ())
        self.calls: list[dict] = []
        self.closed = False
        # What ping() returns, or an exception instance it raises.
        self.ping_result: Any = True
        self._chats: dict[str, list[dict]] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f'<FakeConnection {self.name!r} queued={len(self.replies)} calls={len(self.calls)}>'

    def add_reply(self, *replies: Any) -> None:
        self.replies.extend(replies)

    # The public API of a connection

    def invoke(self, text: str, skill: str = '', **params: Any) -> dict:
        return self._answer('invoke', text, '', skill, params)

    def chat(self, text: str, chat_id: str = '', skill: str = '', **params: Any) -> dict:
        return self._answer('chat', text, chat_id, skill, params)

    def stream(self, text: str, chat_id: str = '', skill: str = '', **params: Any) -> Iterator[Event]:
        """Checks and records now; deltas, then one ``done``, as the caller iterates."""
        _check(text, chat_id, skill=skill, params=params, reserved=self.reserved_params)
        reply = self._record_and_pop('stream', text, chat_id, skill, params)
        return self._stream(reply, text, chat_id, skill)

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

    def _answer(self, method: str, text: str, chat_id: str, skill: str, params: dict) -> dict:
        _check(text, chat_id, skill=skill, params=params, reserved=self.reserved_params)
        reply = self._record_and_pop(method, text, chat_id, skill, params)
        result = self._result(reply, text, chat_id, skill)
        self._save(chat_id, text, result['text'])
        return result

    def _record_and_pop(self, method: str, text: str, chat_id: str, skill: str, params: dict) -> Any:
        with self._lock:
            self.calls.append({'method': method, 'text': text, 'chat_id': chat_id, 'skill': skill,
                               'params': dict(params)})
            return self.replies.popleft() if self.replies else None

    def _window(self, chat_id: str) -> list[dict]:
        """The stored messages a real connection would send: the last max_history_turns - 1 turns."""
        if not chat_id:
            return []
        keep = 2 * (self.max_history_turns - 1)
        with self._lock:
            messages = self._chats.get(chat_id, [])
            return list(messages[-keep:]) if keep > 0 else []

    def _result(self, reply: Any, text: str, chat_id: str, skill: str) -> dict:
        if isinstance(reply, type) and issubclass(reply, BaseException):
            reply = reply()
        if isinstance(reply, BaseException):
            raise reply
        window = self._window(chat_id)
        users = [m['content'] for m in window if m['role'] == 'user'] + [text]
        echo = reply_text(users, bool(skill))
        result: dict = {'text': reply if isinstance(reply, str) else echo}
        if isinstance(reply, Mapping):
            result.update(reply)
        result.setdefault('usage', {
            'input_tokens': count_words(skill, text, *(m['content'] for m in window)),
            'output_tokens': count_words(result['text']),
            'cache_read_tokens': 0, 'cache_write_tokens': 0, 'reasoning_tokens': 0,
        })
        result.setdefault('raw', {'fake': True, 'text': result['text']})
        return result

    def _save(self, chat_id: str, text: str, answer: str) -> None:
        if not chat_id:
            return
        with self._lock:
            self._chats.setdefault(chat_id, []).extend(
                [{'role': 'user', 'content': text}, {'role': 'assistant', 'content': answer}])

    def _stream(self, reply: Any, text: str, chat_id: str, skill: str) -> Iterator[Event]:
        result = self._result(reply, text, chat_id, skill)
        if result.get('thinking'):
            yield Event('thinking', text=result['thinking'])
        for piece in text_chunks(result['text']):
            yield Event('text', text=piece)
        self._save(chat_id, text, result['text'])
        yield Event('done', result=result)


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
