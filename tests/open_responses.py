"""Checks against the Open Responses specification (``openresponses-types``, release 2026-04-24), strict.

:func:`check_response` validates a Response body's output items and
:func:`check_event` a stream event, each with the specification's own
pydantic models in strict mode (from JSON, as a client reads them). The
event's model is found by its ``type``, from the models' own ``type``
fields, so a new event kind in the specification needs no edit here.
"""

from __future__ import annotations

import json
import typing
from enum import Enum

import openresponses_types as spec
from pydantic import BaseModel, TypeAdapter

OUTPUT_ITEM = TypeAdapter(spec.Message | spec.FunctionCall | spec.FunctionCallOutput | spec.ReasoningBody)
# The events that carry a whole Response: their items are checked as a Response's are.
RESPONSE_EVENTS = ('response.created', 'response.queued', 'response.in_progress', 'response.completed',
                   'response.failed', 'response.incomplete')


def _event_type(model: type) -> str | None:
    annotation = typing.get_type_hints(model, include_extras=True).get('type')
    kind = typing.get_args(annotation)[0] if typing.get_origin(annotation) is typing.Annotated else annotation
    if isinstance(kind, type) and issubclass(kind, Enum) and len(kind) == 1:
        return next(iter(kind)).value
    values = typing.get_args(kind) if typing.get_origin(kind) is typing.Literal else ()
    return values[0] if len(values) == 1 else None


EVENTS = {_event_type(m): m for name, m in vars(spec).items()
          if name.endswith('StreamingEvent') and isinstance(m, type) and issubclass(m, BaseModel)}


def _strict(model, value: dict) -> None:
    raw = json.dumps(value)
    if isinstance(model, TypeAdapter):
        model.validate_json(raw, strict=True)
    else:
        model.model_validate_json(raw, strict=True)


def check_response(body: dict) -> dict:
    """``body`` (a Response), once every output item validates; the body itself is handed back."""
    for item in body['output']:
        _strict(OUTPUT_ITEM, item)
    return body


def check_event(event: dict) -> dict:
    """``event`` (one stream event), once it validates as the specification's event of its type."""
    kind = event['type']
    if kind in RESPONSE_EVENTS:
        check_response(event['response'])
    else:
        assert kind in EVENTS, f'{kind} is not an Open Responses stream event'
        _strict(EVENTS[kind], event)
    return event
