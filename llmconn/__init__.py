"""llmconn: LLM connections for Zato-style services.

    registry = llmconn.Registry.from_file('etc/llm.yaml')
    reply = registry['My Claude'].chat('Hello', chat_id='user-1')

History lives in a shared Redis, calls to one chat are serialized by a
distributed lock, and every provider speaks its real wire format.

The names below are imported on first use (PEP 562 ``__getattr__``):
``import llmconn`` pulls in neither ``requests`` nor ``redis``, so
``llmconn serve`` can let gevent monkey-patch before they load, in the same
process. The library itself never patches anything.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = '0.1.0'

# Public name → the module that defines it.
_LAZY = {
    'Registry': 'llmconn.registry',
    'Event': 'llmconn.types',
    'Tool': 'llmconn.tools',
    'Attachment': 'llmconn.attachments',
    **{name: 'llmconn.errors' for name in (
        'LLMConnError', 'ConfigError', 'InvalidInput', 'UnknownConnection', 'InactiveConnection', 'LLMError',
        'LLMTimeout', 'LLMUnreachable', 'LLMRateLimited', 'LLMAuthError', 'ChatBusy', 'StoreError', 'LockLost', 'ServiceError',
        'UnknownService', 'ToolLoopLimit', 'StructuredOutputError')},
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value         # looked up once; later reads skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
