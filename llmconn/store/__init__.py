"""Chat history and the distributed per-chat lock, in Redis.

``open_store(url)`` gives a :class:`ChatStore`; ``store.begin(...)`` locks a
chat and reads its window (one round trip) and returns a :class:`ChatLock`
whose ``save(turn, ...)`` appends the turn and unlocks (one more round trip).
"""

from llmconn.redact import mask_url
from llmconn.store.connect import open_store
from llmconn.store.history import ChatStore
from llmconn.store.keys import ChatKeys, chat_keys
from llmconn.store.lock import ChatLock

__all__ = ['ChatKeys', 'ChatLock', 'ChatStore', 'chat_keys', 'mask_url', 'open_store']
