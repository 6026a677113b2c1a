"""Structured output: ``schema=`` on a call, the schema the providers get, and the parsed answer.

A call's ``schema`` is a pydantic model class or a JSON Schema dict. It is
checked before any request with the limits of tool schemas
(:func:`llmconn.tools.check_schema`: draft 2020-12, an object at the root,
bounded size and depth, no reference outside itself), and sent natively by
each provider mapping (``Request.schema``: an :class:`OutputSchema`).

What is sent is the schema made *strict* as OpenAI's and Claude's
structured outputs demand it: every object closed (``additionalProperties:
false`` where it was not said) and every property required, which is what
the ``openai`` SDK does to a pydantic model. The answer is validated against
the caller's own schema (the model class, or the dict as given), which the
strict one only narrows. A final answer that is not JSON, or does not
validate, raises :class:`~llmconn.errors.StructuredOutputError` holding the
text; a refusal raises it holding the refusal.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Iterable

import jsonschema
import pydantic

from llmconn import items as mod_items
from llmconn import tools as mod_tools
from llmconn.errors import InvalidInput, StructuredOutputError

DEFAULT_NAME = 'output'             # a dict schema without a title
NO_REASON = '(the model refused without saying why)'    # .refusal of a refusal with no words (Claude's)
_not_a_name = re.compile(r'[^a-zA-Z0-9_-]')
# Where subschemas sit in a schema (draft 2020-12), so strictness reaches every nested object.
_SUBSCHEMA_MAPS = ('properties', '$defs', 'definitions', 'patternProperties', 'dependentSchemas')
_SUBSCHEMA_LISTS = ('anyOf', 'oneOf', 'allOf', 'prefixItems')
_SUBSCHEMAS = ('items', 'not', 'if', 'then', 'else', 'contains', 'additionalProperties')


@dataclass(frozen=True)
class OutputSchema:
    """A checked ``schema=``: its ``name``, the ``schema`` sent (strict), and how an answer is validated."""

    name: str
    schema: dict
    model: Any = None               # the pydantic model class, or None for a dict schema
    given: str = ''                 # a dict schema as given, serialized (its validator's cache key)

    def parse(self, text: str) -> Any:
        """The answer as a model instance (or the validated dict); ValueError saying what is wrong."""
        if self.model is not None:
            try:
                return self.model.model_validate_json(text)
            except pydantic.ValidationError as e:
                problems = e.errors(include_url=False, include_input=False)
            if problems and problems[0].get('type') == 'json_invalid':
                raise json.JSONDecodeError(problems[0].get('msg', 'invalid JSON'), text, 0)
            raise ValueError('; '.join(f'{"/".join(map(str, p["loc"])) or "(root)"}: {p["msg"]}'
                                       for p in problems[:5]))
        value = json.loads(text)
        problems = sorted(_validator(self.given).iter_errors(value), key=lambda e: list(e.path))
        if problems:
            raise ValueError('; '.join(f'{"/".join(map(str, e.path)) or "(root)"}: {e.message}'
                                       for e in problems[:5]))
        return value


def prepare(schema: Any) -> OutputSchema | None:
    """``schema=`` checked (InvalidInput) and made ready to send; None for no schema."""
    if schema is None:
        return None
    if isinstance(schema, type) and issubclass(schema, pydantic.BaseModel):
        return _from_model(schema)
    if isinstance(schema, dict):
        try:
            given = json.dumps(schema, sort_keys=True)
        except (TypeError, ValueError, RecursionError):
            given = ''      # check_schema says what is wrong with it
        if given:
            return _from_dict(given)
        mod_tools.check_schema(DEFAULT_NAME, schema, label='schema')
    raise InvalidInput(f'schema must be a pydantic model class or a JSON Schema dict, got '
                       f'{type(schema).__name__}; e.g. schema=Order or schema={{"type": "object", ...}}')


@functools.lru_cache(maxsize=256)
def _from_model(model: type) -> OutputSchema:
    try:
        schema = model.model_json_schema()
    except (pydantic.PydanticUserError, pydantic.PydanticSchemaGenerationError, TypeError) as e:
        raise InvalidInput(f'schema {model.__name__}: pydantic cannot make a JSON Schema of it ({e})') from None
    mod_tools.check_schema(model.__name__, schema, label=f'schema {model.__name__}')
    return OutputSchema(_name(model.__name__), strict(schema), model=model)


@functools.lru_cache(maxsize=256)
def _from_dict(given: str) -> OutputSchema:
    schema = json.loads(given)
    mod_tools.check_schema(DEFAULT_NAME, schema, label='schema')
    return OutputSchema(_name(schema.get('title') or DEFAULT_NAME), strict(schema), given=given)


def _name(title: Any) -> str:
    """A format name as the APIs accept it: 1-64 letters, digits, ``_`` or ``-``."""
    name = _not_a_name.sub('_', str(title))[:64]
    return name or DEFAULT_NAME


def strict(schema: Any) -> Any:
    """A copy of ``schema`` with every object closed and every property required (see the module doc)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: strict(sub) for name, sub in out[key].items()}
    for key in _SUBSCHEMA_LISTS + _SUBSCHEMAS:
        if key in out:
            out[key] = strict(out[key])
    if out.get('type') == 'object' or 'properties' in out:
        out.setdefault('additionalProperties', False)
        out['required'] = list(out.get('properties') or {})
    return out


def parse(output: OutputSchema, steps: Iterable[dict], text: str, connection: str, raw: Any = None) -> Any:
    """The final answer, parsed and validated; StructuredOutputError when it refused or does not fit."""
    refused = refusal(steps)
    if refused is not None:
        raise StructuredOutputError(f'{connection}: the model refused to answer in the schema "{output.name}"; '
                                    f'its words are in .refusal', refusal=refused or NO_REASON, text=text,
                                    provider_body=raw, connection=connection)
    try:
        return output.parse(text)
    except ValueError as e:
        problem = 'is not JSON' if isinstance(e, json.JSONDecodeError) else f'does not validate ({e})'
        raise StructuredOutputError(f'{connection}: the answer {problem} against the schema "{output.name}"; '
                                    f'the text is in .text', text=text, provider_body=raw,
                                    connection=connection) from None


def refusal(steps: Iterable[dict]) -> str | None:
    """The words of the final answer's refusal ('' for none), or None when it did not refuse."""
    said: list[str] | None = None
    for item in steps:
        if item['kind'] in (mod_items.CALL, mod_items.OUTPUT):
            said = None
        elif item['kind'] == mod_items.REFUSAL:
            said = (said or []) + [item['text']]
    return None if said is None else ''.join(said)


@functools.lru_cache(maxsize=256)
def _validator(given: str) -> jsonschema.Draft202012Validator:
    # LOCAL_ONLY: a $ref is resolved inside the schema, never fetched (see llmconn.tools).
    return jsonschema.Draft202012Validator(json.loads(given), registry=mod_tools.LOCAL_ONLY)
