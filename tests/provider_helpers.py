"""Shared helpers of the provider mapping tests: config, SDK-type oracles, SSE fixtures."""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, Iterable

from pydantic import BaseModel, TypeAdapter

from llmconn.config import load_dict
from llmconn.providers import PROVIDERS
from llmconn.providers.base import SSE
from llmconn.types import Reply

SECRET = 'sk-test-very-secret-0123456789'


def make_provider(provider: str, **fields: Any):
    """A provider built from config loaded the way llm.yaml is (so check_config runs)."""
    conn = {'name': f'test {provider}', 'provider': provider, 'model': 'test-model', 'secret': SECRET}
    conn.update(fields)
    conf = load_dict({'llm': [conn]}).llm[0]
    return PROVIDERS[conf.provider](conf)


def materialize(value: Any) -> Any:
    """Pydantic validates ``Iterable`` fields lazily; walk them so every element is checked."""
    if isinstance(value, BaseModel):
        return value.model_dump(exclude_unset=True)
    if isinstance(value, dict):
        return {k: materialize(v) for k, v in value.items()}
    if isinstance(value, (str, bytes)):
        return value
    if isinstance(value, (list, tuple)) or hasattr(value, '__next__'):
        return [materialize(v) for v in value]
    return value


@functools.lru_cache(maxsize=None)
def _adapter(sdk_type: Any) -> TypeAdapter:
    """Building an adapter for the big SDK types takes up to a second; each is built once."""
    return TypeAdapter(sdk_type)


def assert_valid(sdk_type: Any, value: Any) -> None:
    """``value`` validates against an SDK TypedDict with nothing dropped or coerced.

    TypedDicts ignore unknown keys by default, so a misspelt key would pass
    silently; comparing the validated copy with the original catches it.
    """
    # Keep the adapter alive while walking: its lazy iterators point into its schema.
    adapter = _adapter(sdk_type)
    validated = materialize(adapter.validate_python(value))
    assert validated == json.loads(json.dumps(value)), f'not exactly a {sdk_type}: {value!r}'


def sse(events: Iterable[BaseModel | dict], named: bool = True) -> list[SSE]:
    """Serialize SDK event models (or dicts) as the SSE tuples the transport yields."""
    out = []
    for event in events:
        data = event.model_dump(mode='json', exclude_unset=True) if isinstance(event, BaseModel) else event
        name = data.get('type', '') if named and isinstance(data, dict) else ''
        out.append(SSE((name, json.dumps(data))))
    return out


def run_stream(provider, events: Iterable[SSE]) -> tuple[list, Reply]:
    """Drain parse_stream; return the deltas as (type, text) and the reply it ends with."""
    out = list(provider.parse_stream(iter(events)))
    assert [isinstance(e, Reply) for e in out].count(True) == 1 and isinstance(out[-1], Reply), out
    return [(e.type, e.text) for e in out[:-1]], out[-1]


def same_answer(a: Reply, b: Reply) -> bool:
    """Two replies say the same thing (``raw`` differs by how it arrived)."""
    return dataclasses.replace(a, raw=None) == dataclasses.replace(b, raw=None)
