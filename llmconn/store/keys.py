"""Redis key names of a chat, safe for any connection name and chat id.

A chat id is whatever a service passes (a user id, an e-mail, free text), so
it must never be able to shape the key: both the connection name and the chat
id are written as unpadded base64url of their UTF-8 bytes. That alphabet has
no ``{``, ``}`` or ``:``, so

* two different (connection, chat) pairs never map to the same keys
  (base64 is injective and ``:`` cannot occur inside either half), and
* the hash tag ``{<connection>:<chat>}`` is exactly the part between the
  braces, so every key of one chat lives in one Redis Cluster slot and a
  script may touch them all.
"""

from __future__ import annotations

from base64 import urlsafe_b64encode
from typing import NamedTuple

# Every key llmconn writes starts with this, so an operator can find (and SCAN) them.
KEY_PREFIX = 'llmconn'

# Connection names are few and reused on every call; their encoding is cached.
# Chat ids are many and each is encoded per call (about half a microsecond).
_encoded_names: dict[str, str] = {}


class ChatKeys(NamedTuple):
    """The keys of one chat of one connection."""

    turns: str      # list of JSON turns, oldest first
    lock: str       # string: the random token of the current holder
    wake: str       # list of at most one element: "the lock was just released"
    waiting: str    # string flag, short expiry: "someone is blocked on ``wake``"


def encode(value: str) -> str:
    """Unpadded base64url of the UTF-8 bytes; lone surrogates pass through, so any str works."""
    return urlsafe_b64encode(value.encode('utf-8', 'surrogatepass')).rstrip(b'=').decode('ascii')


def chat_keys(conn_name: str, chat_id: str) -> ChatKeys:
    """The keys of ``chat_id`` under connection ``conn_name``, all in one cluster slot."""
    enc_conn = _encoded_names.get(conn_name)
    if enc_conn is None:
        enc_conn = _encoded_names[conn_name] = encode(conn_name)
    base = f'{KEY_PREFIX}:{{{enc_conn}:{encode(chat_id)}}}:'
    return ChatKeys(base + 'turns', base + 'lock', base + 'wake', base + 'waiting')
