"""Request values, as the capability matrix reads them: provider params, no-ops, and parts of fields.

The matrix (:mod:`llmconn.gateway.capabilities`) says per backend kind what
becomes of a field; these functions say how: the params a value becomes
(``param``, ``generation``, the format translations between the two OpenAI
APIs), whether a value asks for anything beyond the default
(``is_text_format``), and where a part of a field is read from the body
(``inside``, ``summary``, ``strict``). None does I/O.
"""

from __future__ import annotations

from typing import Any, Callable

Mapper = Callable[[Any], dict]


def param(name: str) -> Mapper:
    return lambda value: {name: value}


def generation(name: str) -> Mapper:
    return lambda value: {'generationConfig': {name: value}}


def stop_list(value: Any) -> list:
    return [value] if isinstance(value, str) else list(value or ())


# The params key under which a json_schema format goes to a backend as the call's schema= (not a body field).
SCHEMA = 'llmconn.schema'


def schema_of(fmt: Any) -> dict:
    """A Responses json_schema ``text.format`` as the call's ``schema=`` (its JSON Schema)."""
    return {SCHEMA: (fmt or {}).get('schema') or {}}


def json_schema_format(body: dict) -> Any:
    """The Responses ``text.format`` when it is a json_schema one (None otherwise)."""
    text = body.get('text')
    fmt = text.get('format') if isinstance(text, dict) else None
    return fmt if isinstance(fmt, dict) and fmt.get('type') == 'json_schema' else None


def json_schema_response_format(body: dict) -> Any:
    """The Chat Completions ``response_format`` when it is a json_schema one (None otherwise)."""
    fmt = body.get('response_format')
    return fmt if isinstance(fmt, dict) and fmt.get('type') == 'json_schema' else None


def is_plain_response_format(value: Any) -> bool:
    """``response_format`` asking for plain text, or for json_schema (a row of its own)."""
    return value is None or (isinstance(value, dict) and value.get('type') in ('text', 'json_schema'))


def chat_format(text: Any) -> dict:
    """Responses ``text.format`` as Chat Completions ``response_format``."""
    fmt = dict((text or {}).get('format') or {})
    if fmt.get('type') != 'json_schema':
        return {'response_format': fmt}
    schema = {k: fmt[k] for k in ('name', 'schema', 'strict', 'description') if k in fmt}
    return {'response_format': {'type': 'json_schema', 'json_schema': schema}}


def responses_format(fmt: Any) -> dict:
    """Chat Completions ``response_format`` as Responses ``text.format``."""
    fmt = dict(fmt or {})
    if fmt.get('type') == 'json_schema':
        fmt = {'type': 'json_schema', **(fmt.get('json_schema') or {})}
    return {'text': {'format': fmt}}


def is_text_format(value: Any) -> bool:
    """``text`` asking for no format but plain text (the default); its verbosity and a json_schema
    format are rows of their own."""
    if not isinstance(value, dict):
        return not value
    fmt = value.get('format')
    return not fmt or (isinstance(fmt, dict) and fmt.get('type', 'text') in ('text', 'json_schema'))


def inside(name: str, key: str) -> Callable[[dict], Any]:
    """The value of ``body[name][key]`` (None when absent)."""
    def get(body: dict) -> Any:
        value = body.get(name)
        return value.get(key) if isinstance(value, dict) else None
    return get


def only_summary(reasoning: Any) -> bool:
    """Whether a ``reasoning`` object asks for nothing but a summary (or is absent)."""
    return reasoning is None or isinstance(reasoning, dict) and \
        {k for k, v in reasoning.items() if v is not None} <= {'summary', 'generate_summary'}


def summary(body: dict) -> Any:
    reasoning = body.get('reasoning')
    return (reasoning.get('summary') or reasoning.get('generate_summary')) if isinstance(reasoning, dict) else None


def strict(function_key: str = '') -> Callable[[dict], bool]:
    """Whether any function tool asks for ``strict`` (Chat Completions nests it in ``function``)."""
    def get(body: dict) -> bool:
        tools = body.get('tools')
        for tool in tools if isinstance(tools, list) else ():
            spec = tool.get(function_key) if function_key and isinstance(tool, dict) else tool
            if isinstance(spec, dict) and spec.get('strict') is True:
                return True
        return False
    return get
