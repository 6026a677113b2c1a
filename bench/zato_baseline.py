"""The baseline: a chat call written the way Zato 4.1 does it, for side-by-side figures.

One JSON blob per chat: take a redis-py ``Lock`` (which polls every 0.1 s
while it waits, and is never renewed), GET the whole history, call the
provider with the window, append the turn, SET the whole history back with
its expiry, release the lock. The provider call goes through the same
llmconn connection (mapping, pool, transport), so only the storage and the
lock differ from llmconn's own ``chat``.
"""

from __future__ import annotations

import json

from llmconn.types import Request, Turn

# As Zato: the lock outlives the provider timeout by this margin.
LOCK_TTL_MARGIN = 30


class ZatoStyleChat:
    """``chat`` of one llmconn connection, with Zato's storage and lock."""

    def __init__(self, conn, client) -> None:
        self.conn = conn
        self.client = client

    def key(self, chat_id: str) -> str:
        return f'zato-style:{self.conn.name}:{chat_id}'

    def chat(self, text: str, chat_id: str) -> dict:
        conf, key = self.conn.conf, self.key(chat_id)
        lock = self.client.lock(key + ':lock', timeout=conf.timeout + LOCK_TTL_MARGIN,
                                blocking_timeout=conf.lock_wait)
        with lock:
            raw = self.client.get(key)
            history = json.loads(raw) if raw else []
            keep = 2 * (conf.max_history_turns - 1)
            window = history[-keep:] if keep else []
            turns = tuple(Turn(user=u['content'], assistant=a['content']) for u, a in zip(window[::2], window[1::2]))
            provider = self.conn.provider
            body = provider.build_request(Request(text, '', turns))
            reply = provider.parse_response(self.conn.transport.post(provider.url(), self.conn._headers, body))
            history += [{'role': 'user', 'content': text}, {'role': 'assistant', 'content': reply.text}]
            self.client.set(key, json.dumps(history), ex=int(conf.chat_expiry))
        return reply.as_result()

    def seed(self, chat_id: str, turns: int) -> None:
        history = []
        for i in range(turns):
            history += [{'role': 'user', 'content': f'seed message {i}'},
                        {'role': 'assistant', 'content': f'seed answer {i} with a few more words'}]
        self.client.set(self.key(chat_id), json.dumps(history), ex=int(self.conn.conf.chat_expiry))

    def delete(self, chat_id: str) -> None:
        self.client.delete(self.key(chat_id), self.key(chat_id) + ':lock')
