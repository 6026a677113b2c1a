"""Test doubles shipped with llmconn.

- :class:`FakeProviderServer` - an HTTP server speaking the real Claude,
  OpenAI (Chat Completions and Responses) and Gemini wire formats, in this
  process or (``FakeProviderServer.spawn()``) in a subprocess.
- :class:`FakeConnection` and :class:`FakeRegistry` - in-memory stand-ins
  for a connection and the registry, for unit tests of services.

Names are imported lazily, so ``python -m llmconn.testing.fake_server`` does
not import its own module twice.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    'FakeProviderServer': 'llmconn.testing.fake_server',
    'FakeProviderProcess': 'llmconn.testing.fake_control',
    'FakeConnection': 'llmconn.testing.fake',
    'FakeRegistry': 'llmconn.testing.fake',
    'reply_text': 'llmconn.testing.fake_common',
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    return getattr(importlib.import_module(module), name)
