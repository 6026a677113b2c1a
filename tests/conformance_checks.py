"""Oracles for what the gateway sends: the Open Responses schema and the ``openai`` SDK's types, both strict.

Open Responses (``openresponses-types`` 2.4, the pydantic models generated
from the specification's OpenAPI document, release 2026-04-24) is validated
in pydantic's strict mode from the JSON text itself: an integer field gets
an integer (``1796161829.26`` is refused, not truncated), an enum its exact
string. The SDK's models accept keys they do not know and keep them in
``model_extra``; a key no SDK model knows is a field the gateway invented,
and is refused here unless it is one of the documented extensions below.

Raw bodies and raw SSE events are checked, not what the SDK parsed from them
(its parse is lenient).
"""

from __future__ import annotations

import copy
import json
from typing import Any, Iterator

import openresponses_types as ort
import requests
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel, TypeAdapter

SDK_EVENT = TypeAdapter(ResponseStreamEvent)

# Fields the gateway adds on purpose (SPEC §13, docs/gateway.md), where the SDK has no field for them.
EXTENSIONS = {
    'ChatCompletion.metadata',              # metadata["llmconn_downgrades"]: the losses a request accepted,
    'ChatCompletionChunk.metadata',         # and ["llmconn_served_by"]: the fallback that answered (last chunk)
    'ChatCompletionMessage.reasoning_content',  # the backend's thinking, as DeepSeek and vLLM send it
    'ChoiceDelta.reasoning_content',
}
# Fields the Open Responses specification requires of a Response that this SDK release does not declare
# (store, presence_penalty, frequency_penalty): the specification's, not invented.
EXTENSIONS |= {f'Response.{name}' for name in ort.ResponseResource.model_fields}


def _event_models() -> dict[str, type[BaseModel]]:
    """Open Responses' streaming event models by their ``type`` value."""
    models = {}
    for name in dir(ort):
        model = getattr(ort, name)
        if name.endswith('StreamingEvent') and isinstance(model, type) and issubclass(model, BaseModel):
            annotation = model.model_fields['type'].annotation
            for value in getattr(annotation, '__members__', {}).values():
                models[str(value.value)] = model
    return models


ORT_EVENTS = _event_models()
# Events of the SDK that the Open Responses specification does not define (custom tools are OpenAI's own).
SDK_ONLY_EVENTS = {'response.custom_tool_call_input.delta', 'response.custom_tool_call_input.done'}


def invented(model: Any, path: str = '') -> list[str]:
    """The keys of a validated SDK model (and the models inside it) that no SDK model declares."""
    found = []
    if isinstance(model, BaseModel):
        for key in (model.model_extra or {}):
            if f'{type(model).__name__}.{key}' not in EXTENSIONS:
                found.append(f'{path}{type(model).__name__}.{key}')
        for name in type(model).model_fields:
            found += invented(getattr(model, name), f'{path}{name}.')
    elif isinstance(model, (list, tuple)):
        for index, value in enumerate(model):
            found += invented(value, f'{path}[{index}].')
    elif isinstance(model, dict):
        for key, value in model.items():
            found += invented(value, f'{path}{key}.')
    return found


def _for_ort(body: dict) -> dict:
    """``body`` as the generated models can read it: their one known defect worked around.

    The generator typed ``JsonSchemaResponseFormat.schema`` as ``None`` (the OpenAPI document leaves it
    an open object), so a json_schema format echoed whole would fail for the model's sake, not ours.
    """
    fmt = (body.get('text') or {}).get('format') or {}
    if fmt.get('type') != 'json_schema':
        return body
    body = copy.deepcopy(body)
    assert isinstance(body['text']['format'].get('schema'), dict)
    body['text']['format']['schema'] = None
    return body


def check_response(body: dict) -> Response:
    """A Response body: Open Responses ``ResponseResource`` (strict) and the SDK's ``Response``."""
    ort.ResponseResource.model_validate_json(json.dumps(_for_ort(body)), strict=True)
    response = Response.model_validate(body)
    assert invented(response) == [], invented(response)
    return response


def check_event(event: dict) -> None:
    """One streamed event: its Open Responses model (strict) and the SDK's event union."""
    kind = event['type']
    if kind not in SDK_ONLY_EVENTS:
        assert kind in ORT_EVENTS, f'{kind} is not an Open Responses event'
        data = dict(event, response=_for_ort(event['response'])) if 'response' in event else event
        ORT_EVENTS[kind].model_validate_json(json.dumps(data), strict=True)
    parsed = SDK_EVENT.validate_python(event)
    assert invented(parsed) == [], (kind, invented(parsed))
    if 'response' in event:
        check_response(event['response'])


def check_stream(events: list[dict]) -> None:
    """Every event checked, numbered 0, 1, 2, ... in order, opened by created/in_progress, ended once."""
    for event in events:
        check_event(event)
    assert [e['sequence_number'] for e in events] == list(range(len(events)))
    assert [e['type'] for e in events[:2]] == ['response.created', 'response.in_progress']
    ends = [e['type'] for e in events if e['type'] in ('response.completed', 'response.incomplete',
                                                        'response.failed')]
    assert len(ends) == 1 and events[-1]['type'] == ends[0]


def check_completion(body: dict) -> ChatCompletion:
    completion = ChatCompletion.model_validate(body)
    assert invented(completion) == [], invented(completion)
    return completion


def check_chunk(chunk: dict) -> ChatCompletionChunk:
    parsed = ChatCompletionChunk.model_validate(chunk)
    assert invented(parsed) == [], invented(parsed)
    return parsed


def post(url: str, secret: str, body: dict) -> requests.Response:
    return requests.post(url, json=body, headers={'Authorization': f'Bearer {secret}'}, timeout=20)


def sse_data(answer: requests.Response) -> Iterator[str]:
    """The ``data:`` payloads of a raw SSE answer, as sent."""
    assert answer.status_code == 200, answer.text
    for block in answer.text.split('\n\n'):
        for line in block.split('\n'):
            if line.startswith('data: '):
                yield line[len('data: '):]
