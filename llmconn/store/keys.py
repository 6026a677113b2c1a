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
from functools import lru_cache
from typing import NamedTuple

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

# Every key llmconn writes starts with this, so an operator can find (and SCAN) them.
KEY_PREFIX = 'llmconn'

# Connection names are few and reused on every call; their encoding is cached. Chat ids are
# many, but a chat's calls come in runs: the keys of the last CACHED_CHATS chats are kept.
_encoded_names: dict[str, str] = {}
CACHED_CHATS = 1024


class ChatKeys(NamedTuple):
    """The keys of one chat of one connection, all sharing one hash tag (one cluster slot)."""

    turns: str      # list of JSON turns, oldest first
    lock: str       # string: the token of the current holder; a waiter's wake-up list is lock + ':' + its token
    queue: str      # list of waiting calls, first come first
    seq: str        # counter numbering the waiting calls (their place, for observers)
    saved: str      # list of the tokens of the last saves, newest first: a re-sent save is recognised

    def beside(self, suffix: str) -> str:
        """Another key in this chat's slot (e.g. a usage ledger a save script may also write)."""
        return f'{self.turns.rpartition(":")[0]}:{suffix}'

    def wake(self, token: str) -> str:
        """The list a waiting call blocks on; the lock scripts derive the same name."""
        return f'{self.lock}:{token}'


def encode(value: str) -> str:
    """Unpadded base64url of the UTF-8 bytes; lone surrogates pass through, so any str works."""
    return urlsafe_b64encode(value.encode('utf-8', 'surrogatepass')).rstrip(b'=').decode('ascii')


@lru_cache(maxsize=CACHED_CHATS)
def chat_keys(conn_name: str, chat_id: str) -> ChatKeys:
    """The keys of ``chat_id`` under connection ``conn_name``, all in one cluster slot."""
    enc_conn = _encoded_names.get(conn_name)
    if enc_conn is None:
        enc_conn = _encoded_names[conn_name] = encode(conn_name)
    base = f'{KEY_PREFIX}:{{{enc_conn}:{encode(chat_id)}}}:'
    return ChatKeys(base + 'turns', base + 'lock', base + 'queue', base + 'seq', base + 'saved')


# Redis Cluster's slots: a ledger on a cluster keeps one hash per slot and day.
HASH_SLOTS = REDIS_CLUSTER_HASH_SLOTS


def slot_of(key: str) -> int:
    """The Redis Cluster slot of ``key`` (its hash tag's, when it has one)."""
    return key_slot(key.encode('utf-8', 'surrogatepass'))
