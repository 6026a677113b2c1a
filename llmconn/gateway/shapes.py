"""The types and ranges of a request's fields, checked before anything else looks at them.

A wrong-typed field (``text: "abc"``, ``stop: 5``, ``temperature: "hot"``)
or a number out of the API's range (``max_tokens: -5``, ``top_p: 7``) is a
400 naming the field, in OpenAI's error shape, before the capability matrix
reads the request and before any provider is called. The models below are
pydantic's, strict (no ``"0.5"`` taken for 0.5, no ``1`` for ``true``),
and refuse keys an object does not have; the values allowed follow the
``openai`` SDK's types (a test compares them).

Fields whose content the route itself parses (``input``, ``messages``,
``tools``, ``metadata``, ``include``) are checked here only for their
container and size: :data:`MAX_INPUT_ITEMS` items, :data:`MAX_TOOLS` tools,
so one request cannot hold a worker with work that grows with its length.
Fields not named here are the matrix's (unknown ones are refused there).
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, Literal, Union

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from llmconn.config import MAX_COUNT
from llmconn.errors import GatewayError
from llmconn.gateway.echo import shown

# Budgets of one request. A conversation of ten thousand items is a long agent run; past it, parsing and
# replaying the items (about 30 µs each) would hold the worker for longer than a request should.
MAX_INPUT_ITEMS = 10_000
MAX_TOOLS = 128                 # OpenAI's own limit on tools per request
MAX_STOP_SEQUENCES = 4          # as OpenAI allows

Effort = Literal['none', 'minimal', 'low', 'medium', 'high', 'xhigh', 'max']
Summary = Literal['auto', 'concise', 'detailed']
Verbosity = Literal['low', 'medium', 'high']
Tier = Literal['auto', 'default', 'flex', 'scale', 'priority', 'fast']
Temperature = Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)]
Unit = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Penalty = Annotated[float, Field(ge=-2, le=2, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=1, le=MAX_COUNT)]
OutputLimit = Annotated[int, Field(ge=16, le=MAX_COUNT)]    # the Open Responses specification's floor
Identifier = Annotated[str, Field(max_length=512)]          # OpenAI's limit on user
Key = Annotated[str, Field(max_length=64)]                  # safety_identifier, prompt_cache_key (the spec's)

_STRICT = ConfigDict(strict=True, extra='forbid')


class _Shape(BaseModel):
    model_config = _STRICT


class Reasoning(_Shape):
    effort: Effort | None = None
    summary: Summary | None = None
    generate_summary: Summary | None = None


class TextFormat(_Shape):
    type: Literal['text', 'json_object']


class JsonSchemaFormat(_Shape):
    """Responses ``text.format`` of type json_schema (its fields side by side with ``type``)."""

    type: Literal['json_schema']
    name: Annotated[str, Field(min_length=1, max_length=64)]
    schema_: dict = Field(alias='schema')
    description: str | None = None
    strict: bool | None = None


class Text(_Shape):
    format: Annotated[Union[TextFormat, JsonSchemaFormat], Field(discriminator='type')] | None = None
    verbosity: Verbosity | None = None


class JsonSchemaSpec(_Shape):
    name: Annotated[str, Field(min_length=1, max_length=64)]
    schema_: dict | None = Field(None, alias='schema')
    description: str | None = None
    strict: bool | None = None


class ChatJsonSchema(_Shape):
    """Chat Completions ``response_format`` of type json_schema (the schema nested in ``json_schema``)."""

    type: Literal['json_schema']
    json_schema: JsonSchemaSpec


class StreamOptions(_Shape):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class _Common(BaseModel):
    """The fields both routes share; unknown ones pass on to the capability matrix."""

    model_config = ConfigDict(strict=True, extra='ignore')

    temperature: Temperature | None = None
    top_p: Unit | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: Identifier | None = None
    safety_identifier: Key | None = None
    prompt_cache_key: Key | None = None
    prompt_cache_retention: Literal['in_memory', '24h'] | None = None
    service_tier: Tier | None = None
    tools: Annotated[list, Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: Union[Literal['none', 'auto', 'required'], dict] | None = None


class ResponsesShape(_Common):
    input: Union[str, Annotated[list, Field(max_length=MAX_INPUT_ITEMS)]] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: OutputLimit | None = None
    max_tool_calls: Count | None = None
    reasoning: Reasoning | None = None
    text: Text | None = None
    truncation: Literal['auto', 'disabled'] | None = None
    include: list[str] | None = None
    background: bool | None = None


class ChatShape(_Common):
    messages: Annotated[list, Field(min_length=1, max_length=MAX_INPUT_ITEMS)]
    max_tokens: Count | None = None
    max_completion_tokens: Count | None = None
    n: Annotated[int, Field(ge=1, le=128)] | None = None
    stop: Union[str, Annotated[list[str], Field(max_length=MAX_STOP_SEQUENCES)]] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    seed: int | None = None
    logprobs: bool | None = None
    logit_bias: dict[str, Annotated[int, Field(ge=-100, le=100)]] | None = None
    response_format: Annotated[Union[TextFormat, ChatJsonSchema], Field(discriminator='type')] | None = None
    reasoning_effort: Effort | None = None
    verbosity: Verbosity | None = None
    modalities: list[Literal['text', 'audio']] | None = None


SHAPES = {'responses': ResponsesShape, 'chat.completions': ChatShape}


def check(route: str, body: Any) -> None:
    """Refuse ``body`` (400 naming the first bad field) unless each field it sets has its type and range."""
    if not isinstance(body, dict):
        raise GatewayError('the request body must be a JSON object')
    try:
        SHAPES[route].model_validate(body)
    except pydantic.ValidationError as e:
        raise _refusal(_telling(e.errors(include_url=False)), SHAPES[route]) from None


def _telling(errors: list[dict]) -> dict:
    """The error that says most: the deepest, and a range or value over a union member's type mismatch."""
    return max(errors, key=lambda e: (len(e['loc']) - (1 if e['type'] in _TYPE_ERRORS else 0),
                                      e['type'] not in _TYPE_ERRORS))


# Pydantic's type errors, said in JSON's words (pydantic's own words name its model classes).
_TYPE_ERRORS = {'dict_type': 'must be an object', 'model_type': 'must be an object',
                'model_attributes_type': 'must be an object', 'string_type': 'must be a string',
                'list_type': 'must be a list', 'bool_type': 'must be true or false', 'float_type': 'must be a number',
                'int_type': 'must be an integer', 'int_from_float': 'must be an integer',
                'finite_number': 'must be a finite number', 'missing': 'is required',
                'extra_forbidden': 'is not a field of this object',
                'union_tag_invalid': 'has a "type" this field does not take',
                'union_tag_not_found': 'needs a "type"'}


def _refusal(error: dict, shape: type[BaseModel]) -> GatewayError:
    where = _path(error['loc'], shape)
    got = error.get('input')
    if error['type'] in ('too_long', 'too_short') and isinstance(got, list):
        limit = (error.get('ctx') or {}).get('max_length')
        if error['type'] == 'too_long':
            return GatewayError(f'{where} holds {len(got)} entries, more than the limit of {limit}; send fewer',
                                param=where, code='too_many_items')
        return GatewayError(f'{where} may not be empty', param=where)
    problem = _TYPE_ERRORS.get(error['type']) or error['msg'].replace('Input should be', 'must be', 1)
    said = '' if error['type'] in ('missing', 'extra_forbidden') else f' (got {shown(got)})'
    return GatewayError(f'{where} {problem}{said}', param=where, code='invalid_type')


def _path(loc: tuple, shape: type[BaseModel]) -> str:
    """A pydantic location as the field path a client wrote (``text.format.type``, ``stop[2]``).

    Pydantic puts a union's member names (``str``, ``list[str]``, a tag such as ``json_schema``) in the
    location too; they are not the client's, so only the names of the models' own fields are kept.
    """
    out, models = '', [shape]
    for part in loc:
        if isinstance(part, int):
            out += f'[{part}]'
            continue
        fields = {f.alias or name: f for m in models for name, f in m.model_fields.items()}
        if part in fields:
            out += f'.{part}' if out else part
            models = _models_in(fields[part].annotation)
        else:       # a union member, by class name or tag: follow it, show nothing
            models = [m for m in models if part in (m.__name__, _tag(m))] or models
    return out


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation may hold (through Optional, Union, Annotated and list)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _tag(model: type[BaseModel]) -> str:
    field = model.model_fields.get('type')
    values = typing.get_args(field.annotation) if field is not None else ()
    return values[0] if len(values) == 1 else ''
