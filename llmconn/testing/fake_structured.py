"""How the fake provider APIs answer a request for structured output, and the schema rules they enforce.

When a request carries a JSON Schema for the answer (Chat ``response_format``,
Responses ``text.format``, Claude ``output_config.format``, Gemini
``generationConfig.responseJsonSchema``), the model answers with a JSON
document made deterministically from the schema (:func:`instance`: the first
enum value, a string property's own name, ``minimum`` or 1 for numbers, one
item per array), unless the last user text says otherwise:

* ``answer: <text>`` - the answer is ``<text>`` exactly (JSON or not), so a
  test can send what does not parse or validate;
* ``refuse: <words>`` - the model refuses with ``<words>`` (as each API says it).

The checks are the real APIs': a strict schema (OpenAI ``strict: true``,
every Claude format) must close every object with ``additionalProperties:
false``, and OpenAI's must require every property.
"""

from __future__ import annotations

import json
from typing import Any

ANSWER_PREFIX = 'answer:'
REFUSE_PREFIX = 'refuse:'
_MAX_DEPTH = 12         # a recursive schema ($ref to itself) stops here, with the least it can be


def answer(schema: dict, last_user: str) -> tuple[str, str]:
    """``(text, refusal)``: what the model says to ``last_user`` under ``schema``; one of them is ''."""
    said = last_user.strip()
    if said.startswith(REFUSE_PREFIX):
        return '', said[len(REFUSE_PREFIX):].strip() or 'I cannot help with that.'
    if said.startswith(ANSWER_PREFIX):
        return said[len(ANSWER_PREFIX):].strip(), ''
    return json.dumps(instance(schema, schema), separators=(',', ':')), ''


def instance(schema: Any, root: dict, name: str = 'value', depth: int = 0) -> Any:
    """A value that validates against ``schema`` (the subset structured outputs allow)."""
    if not isinstance(schema, dict):
        return None
    ref = schema.get('$ref')
    if isinstance(ref, str) and ref.startswith('#/') and depth < _MAX_DEPTH:
        target: Any = root
        for key in ref[2:].split('/'):
            target = target.get(key, {}) if isinstance(target, dict) else {}
        return instance(target, root, name, depth + 1)
    if 'const' in schema:
        return schema['const']
    if schema.get('enum'):
        return schema['enum'][0]
    for key in ('anyOf', 'oneOf', 'allOf'):
        options = [o for o in schema.get(key) or () if isinstance(o, dict) and o.get('type') != 'null']
        if options:
            return instance(options[0], root, name, depth + 1)
    kind = schema.get('type')
    if isinstance(kind, list):
        kind = next((k for k in kind if k != 'null'), 'null')
    return _of_type(kind, schema, root, name, depth)


def _of_type(kind: Any, schema: dict, root: dict, name: str, depth: int) -> Any:
    if kind == 'object' or 'properties' in schema:
        properties = schema.get('properties') or {}
        if depth >= _MAX_DEPTH:
            properties = {k: v for k, v in properties.items() if k in (schema.get('required') or ())}
        return {key: instance(sub, root, key, depth + 1) for key, sub in properties.items()}
    if kind == 'array':
        count = max(1, schema.get('minItems') or 0) if depth < _MAX_DEPTH else schema.get('minItems') or 0
        return [instance(schema.get('items') or {}, root, name, depth + 1) for _ in range(count)]
    if kind == 'integer':
        return schema.get('minimum', 1)
    if kind == 'number':
        return schema.get('minimum', 1.5)
    if kind == 'boolean':
        return True
    if kind == 'null':
        return None
    text = {'date': '2026-01-31', 'date-time': '2026-01-31T12:00:00Z', 'email': 'ann@example.com'}.get(
        schema.get('format'), name)
    return text.ljust(schema.get('minLength') or 0, '_')


def strict_problem(schema: Any, require_all: bool, path: str = '') -> str:
    """'' when ``schema`` is strict as the API wants it, else the real API's complaint."""
    if isinstance(schema, list):
        return next((p for i, s in enumerate(schema) if (p := strict_problem(s, require_all, f'{path}/{i}'))), '')
    if not isinstance(schema, dict):
        return ''
    if schema.get('type') == 'object' or 'properties' in schema:
        if schema.get('additionalProperties') is not False:
            return f"In context=({path or '()'}), 'additionalProperties' is required to be supplied and to be false."
        missing = [k for k in schema.get('properties') or {} if k not in (schema.get('required') or ())]
        if require_all and missing:
            return (f"In context=({path or '()'}), 'required' is required to be supplied and to be an array "
                    f"including every key in properties. Missing '{missing[0]}'.")
    for key, value in schema.items():
        if isinstance(value, (dict, list)) and key not in ('enum', 'const', 'required', 'default', 'examples'):
            problem = strict_problem(value, require_all, f'{path}/{key}' if path else key)
            if problem:
                return problem
    return ''


# -- each API's field, checked as it checks it; each returns the schema asked for, or None ------------

_NAME_CHARS = frozenset('abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-')


def _named(name: Any) -> bool:
    return isinstance(name, str) and 0 < len(name) <= 64 and set(name) <= _NAME_CHARS


def openai_format(fmt: Any, param: str, error) -> dict | None:
    """Chat's ``response_format`` (``param`` 'response_format') or Responses' ``text.format``
    (``param`` 'text.format', the json_schema fields one level up)."""
    if fmt is None:
        return None
    kind = fmt.get('type') if isinstance(fmt, dict) else None
    if kind in ('text', 'json_object'):
        return None
    if kind != 'json_schema':
        raise error(400, f"Invalid value: '{kind}'. Supported values are: 'text', 'json_object', and "
                         f"'json_schema'.", f'{param}.type', 'invalid_value')
    spec = fmt.get('json_schema') if param == 'response_format' else fmt
    where = f'{param}.json_schema' if param == 'response_format' else param
    if not isinstance(spec, dict) or not _named(spec.get('name')):
        raise error(400, f"Invalid '{where}.name': string does not match pattern. Expected a string that matches "
                         f"the pattern '^[a-zA-Z0-9_-]+$'.", f'{where}.name', 'invalid_value')
    schema = spec.get('schema')
    if not isinstance(schema, dict):
        raise error(400, f"Missing required parameter: '{where}.schema'.", f'{where}.schema',
                    'missing_required_parameter')
    problem = strict_problem(schema, require_all=True) if spec.get('strict') else ''
    if problem:
        raise error(400, f"Invalid schema for {param} '{spec['name']}': {problem}", param, 'invalid_json_schema')
    return schema


def claude_format(config: Any, error) -> dict | None:
    if config is None:
        return None
    fmt = config.get('format') if isinstance(config, dict) else None
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get('type') != 'json_schema' or not isinstance(fmt.get('schema'), dict):
        raise error(400, 'output_config.format: Input should be an object with "type": "json_schema" and "schema"')
    problem = strict_problem(fmt['schema'], require_all=False)
    if problem:
        raise error(400, "output_config.format.schema: For 'object' type, 'additionalProperties' must be "
                         "explicitly set to false")
    return fmt['schema']


def gemini_format(generation: Any, error) -> dict | None:
    schema = generation.get('responseJsonSchema') if isinstance(generation, dict) else None
    if schema is None:
        return None
    if generation.get('responseMimeType') != 'application/json':
        raise error(400, '* GenerateContentRequest.generation_config.response_mime_type: must be '
                         '"application/json" when response_json_schema is set.\n')
    if not isinstance(schema, dict):
        raise error(400, '* GenerateContentRequest.generation_config.response_json_schema: must be an object.\n')
    return schema
