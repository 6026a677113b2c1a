"""Tool schemas: checked once before any network call, and the validators a call's arguments meet.

:func:`check_schema` holds a ``parameters`` schema (or an output schema,
:mod:`llmconn.structured`) to what every provider can take: a JSON object
schema, valid draft 2020-12, within :data:`MAX_SCHEMA_BYTES` and
:data:`MAX_SCHEMA_DEPTH`, whose references stay inside it. A schema is
checked once per process, by the digest of its text. :func:`validation_errors`
checks the arguments of one call against its tool's schema; no validator
fetches anything (:data:`LOCAL_ONLY`).
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import TYPE_CHECKING, Any

import jsonschema
import referencing
import referencing.exceptions

from llmconn.errors import InvalidInput

if TYPE_CHECKING:
    from llmconn.tools import Tool

MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 16
REF_KEYWORDS = ('$ref', '$dynamicRef')


def check_schema(name: str, schema: Any, label: str = '') -> None:
    """One schema within the limits; ``label`` names it in errors (default: the tool's parameters)."""
    label = label or f'tool "{name}": parameters'
    if not isinstance(schema, dict) or schema.get('type') != 'object':
        raise InvalidInput(f'{label} must be a JSON Schema object with "type": "object"')
    try:
        text = json.dumps(schema, sort_keys=True)
    except RecursionError:
        raise InvalidInput(f'{label} nests deeper than the limit of {MAX_SCHEMA_DEPTH} '
                           f'levels; flatten the schema') from None
    except (TypeError, ValueError) as e:
        raise InvalidInput(f'{label} is not JSON ({e})') from None
    _check_refs(label, schema)
    _check_schema_text(label, text)


def _check_refs(label: str, schema: Any) -> None:
    """Only references inside the schema itself (``#...``): anything else would be a URL to fetch.

    jsonschema retrieves an unknown ``$ref`` over HTTP when it validates, which
    would be a request to anywhere, made while the chat's lock is held.
    """
    stack = [schema]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            for key in REF_KEYWORDS:
                ref = value.get(key)
                if ref is not None and not (isinstance(ref, str) and ref.startswith('#')):
                    raise InvalidInput(f'{label} has {key} {short(ref)}, which points outside '
                                       f'the schema; inline it under "$defs" and refer to it as "#/$defs/..."')
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def _check_schema_text(label: str, text: str) -> None:
    """The checks of one serialized schema; a schema that passed (or failed) is not checked again."""
    digest = hashlib.sha256(text.encode('utf-8', 'surrogatepass')).digest()
    problem = _schema_problems.get(digest)
    if problem is None:
        problem = _schema_problem(text)
        if len(_schema_problems) >= MAX_CHECKED_SCHEMAS:
            _schema_problems.pop(next(iter(_schema_problems)), None)      # the oldest goes first
        _schema_problems[digest] = problem
    if problem:
        raise InvalidInput(f'{label} {problem}')


# What was found wrong with each schema checked ('' for nothing), by the digest of its text: jsonschema's
# check_schema costs about 10 µs per byte (0.4 s for 40 KB), so a schema is checked once per process,
# whatever tool name or request carries it. Digests keep the cache small however large the schemas.
MAX_CHECKED_SCHEMAS = 4096
_schema_problems: dict[bytes, str] = {}


def _schema_problem(text: str) -> str:
    schema = json.loads(text)
    size = len(text.encode('utf-8', 'surrogatepass'))
    if size > MAX_SCHEMA_BYTES:
        return f'is {size} bytes serialized, more than the limit of {MAX_SCHEMA_BYTES}; simplify the schema'
    depth = _depth(schema)
    if depth > MAX_SCHEMA_DEPTH:
        return f'nests {depth} levels deep, more than the limit of {MAX_SCHEMA_DEPTH}; flatten the schema'
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as e:
        return f'is not a valid JSON Schema (draft 2020-12): {e.message}'
    return ''


def _depth(value: Any, level: int = 1) -> int:
    if isinstance(value, dict):
        return max([level] + [_depth(v, level + 1) for v in value.values()])
    if isinstance(value, list):
        return max([level] + [_depth(v, level + 1) for v in value])
    return level - 1 if level > 1 else level


# The argument validators of derived tools, by id(tool): their schemas are made by llmconn.tools and
# never change, so a call need not serialize one to find its validator. Tools given as llmconn.Tool
# are the caller's and are looked up by their schema's text on every call.
_derived_validators: dict[int, tuple['Tool', Any]] = {}
MAX_DERIVED_VALIDATORS = 1024


def remember_validator(tool: 'Tool') -> None:
    """Keep the validator of a tool derived from a callable (its schema is never changed)."""
    if len(_derived_validators) >= MAX_DERIVED_VALIDATORS:
        _derived_validators.clear()
    _derived_validators[id(tool)] = (tool, _validator(json.dumps(tool.parameters, sort_keys=True)))


def validation_errors(tool: Tool, arguments: Any) -> str:
    """'' when ``arguments`` validate against the tool's schema, else what is wrong."""
    if not isinstance(arguments, dict):
        return f'arguments must be a JSON object, got {short(arguments)}'
    derived = _derived_validators.get(id(tool))
    if derived is not None and derived[0] is tool:
        validator = derived[1]
    else:
        validator = _validator(json.dumps(tool.parameters, sort_keys=True))
    try:
        problems = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))
    except referencing.exceptions.Unresolvable as e:
        return f'the tool\'s schema refers to {short(str(e.ref) if hasattr(e, "ref") else str(e))}, which is not in it'
    return '; '.join(f'{"/".join(map(str, e.path)) or "(root)"}: {e.message}' for e in problems[:5])


def _refuse_retrieval(uri: str):
    raise referencing.exceptions.NoSuchResource(ref=uri)


# What a validator may resolve beyond its own schema: the JSON Schema meta-schemas (jsonschema adds
# them), nothing fetched. Its default registry would GET any unknown $ref's URL.
LOCAL_ONLY = referencing.Registry(retrieve=_refuse_retrieval)


@functools.lru_cache(maxsize=1024)
def _validator(text: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads(text), registry=LOCAL_ONLY)


def short(value: Any) -> str:
    """``repr(value)``, cut to 80 characters for an error message."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + '...'
