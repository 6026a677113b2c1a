"""Google Gemini ``generateContent`` (``POST {address}/models/{model}:generateContent``).

The skill goes in ``systemInstruction``; history alternates ``user`` and
``model`` contents. ``params`` are body fields; a ``generationConfig`` given
there is merged key by key with ours (so ``temperature`` does not drop
``maxOutputTokens``). Parts marked ``thought: true`` are the model's
reasoning and become the reply's ``thinking``; they are not replayed.

Gemini says no in the body, not with a status: a blocked prompt comes back
as ``promptFeedback.blockReason`` without candidates, a blocked answer as a
candidate whose ``finishReason`` is ``SAFETY`` (or similar) and which holds
no text. Both become :class:`LLMError`.

Streaming uses ``:streamGenerateContent?alt=sse``: every event is a whole
GenerateContentResponse carrying the next piece of text, and there is no
end marker, so a stream is complete only if some chunk carried a
``finishReason``. A server that ignores ``alt=sse`` answers with a JSON
array of the same chunks, which the transport hands on one by one. The
rebuilt answer keeps the latest ``usageMetadata`` any chunk carried, since
the final chunk does not always repeat it.

Tools: ``functionCall`` parts are answered by as many ``functionResponse``
parts, in one user content. Each part that carried a ``thoughtSignature``
goes back verbatim, signature included, to the same model. Gemini gives no
call ids (before Gemini 3), so one is made for each call when it is parsed
and stored with it; it is sent back only when the provider gave it.
"""

from __future__ import annotations

import uuid
from typing import Any, Iterable, Iterator
from urllib.parse import quote

from llmconn import attachments as mod_attachments
from llmconn import items as mod_items
from llmconn.providers.base import SSE, STREAM, STRUCTURED, SYSTEM, TOOLS, Provider
from llmconn.providers.base import attached, is_done_marker, json_event, nonempty, plain_reply
from llmconn.providers.base import tokens
from llmconn.types import Event, Reply, Request

# Finish reasons of an answer that ended normally; any other one with no text means Gemini refused.
_normal_finish = frozenset({'STOP', 'MAX_TOKENS', 'FINISH_REASON_UNSPECIFIED'})


# The API reads both spellings of a field, and refuses a body that sets one field under both
# ("oneof field ... is already set"), so a snake_case generation_config is merged into ours.
_generation_keys = ('generationConfig', 'generation_config')
STRICT_MODE = 'VALIDATED'       # functionCallingConfig.mode: calls adhere to the declared schemas


class GeminiProvider(Provider):
    """Gemini's generateContent REST API."""

    name = 'gemini'
    default_address = 'https://generativelanguage.googleapis.com/v1beta'
    capabilities = frozenset({STREAM, SYSTEM, TOOLS, STRUCTURED})
    json_answer_is_chunks = True       # streamGenerateContent without alt=sse: a JSON array of chunks
    reserved_params = frozenset({'contents', 'systemInstruction', 'system_instruction', 'tools'})
    accepts = {mod_attachments.DATA: mod_attachments.MEDIA_TYPES, mod_attachments.URL: mod_attachments.MEDIA_TYPES}

    cut_short = {'MAX_TOKENS': 'max_output_tokens', 'SAFETY': 'content_filter'}

    def stop_reason(self, raw: dict) -> Any:
        candidate = (raw.get('candidates') or [{}])[0]
        return candidate.get('finishReason') if isinstance(candidate, dict) else None

    def url(self, stream: bool = False) -> str:
        model = self.conf.model
        # A model may be given bare (gemini-2.5-flash) or as its resource name (models/..., tunedModels/...).
        path = model if '/' in model else f'models/{model}'
        method = 'streamGenerateContent?alt=sse' if stream else 'generateContent'
        return f'{self.conf.address}/{quote(path, safe="/")}:{method}'

    def ping_url(self) -> str:
        return f'{self.conf.address}/models'

    def headers(self) -> dict[str, str]:
        headers = {'content-type': 'application/json'}
        if self.conf.secret_value:
            headers['x-goog-api-key'] = self.conf.secret_value
        return headers

    # ---- request

    def build_request(self, request: Request) -> dict[str, Any]:
        contents = []
        for turn in request.history:
            contents += _turn_contents(turn.user, self.steps(turn), attached(turn))
        contents += _turn_contents(request.text, self.current(request), request.attachments)

        body: dict[str, Any] = {'contents': contents}
        tools = list(request.hosted)
        if request.tools:
            tools.insert(0, {'functionDeclarations': [_declaration(t) for t in request.tools]})
        if tools:
            body['tools'] = tools
        if any(t.strict for t in request.tools):
            # Gemini has no per-function strict; VALIDATED mode holds every call of the request to its
            # declaration's schema, which keeps what strict asks for (the other functions are held too).
            body['toolConfig'] = {'functionCallingConfig': {'mode': STRICT_MODE}}
        if request.system:
            body['systemInstruction'] = {'parts': [{'text': request.system}]}
        generation = {'maxOutputTokens': self.conf.max_tokens}
        if request.schema is not None:
            generation.update(responseMimeType='application/json', responseJsonSchema=request.schema.schema)
        params = self.body_params(request)
        for key in _generation_keys:
            generation.update(params.pop(key, None) or {})
        body['generationConfig'] = generation
        body.update(params)
        return body

    # ---- response

    def parse_response(self, body: Any) -> Reply:
        if not isinstance(body, dict) or body.get('error'):
            said = _error_text(body)
            raise self.error(f'Gemini answered with an error: {said}', body, quoted=said)
        self._check_not_blocked(body)
        candidates = body.get('candidates') or []
        if not candidates:
            raise self.error('Gemini answered without any candidate; see provider_body for why', body)
        candidate = candidates[0] if isinstance(candidates[0], dict) else {}
        parts = [p for p in (candidate.get('content') or {}).get('parts') or () if isinstance(p, dict)]
        text = ''.join(p.get('text') or '' for p in parts if not p.get('thought'))
        finish = candidate.get('finishReason')
        if not text and finish and finish not in _normal_finish:
            raise self.error(f'Gemini stopped the answer (finishReason {finish}) before it said anything; '
                             f'rephrase the message or adjust safetySettings in params', body)
        usage = body.get('usageMetadata') or {}
        return Reply(text=text, steps=tuple(_step(p) for p in parts if not p.get('thought')),
                     **_usage(usage),
                     raw=body, thinking=''.join(p.get('text') or '' for p in parts if p.get('thought')),
                     response_id=body.get('responseId') or '', model=body.get('modelVersion') or '')

    def _check_not_blocked(self, body: dict) -> None:
        reason = (body.get('promptFeedback') or {}).get('blockReason')
        if reason:
            raise self.error(f'Gemini blocked the prompt (blockReason {reason}); rephrase the message '
                             f'or adjust safetySettings in params', body)

    def parse_stream(self, events: Iterable[SSE]) -> Iterator[Event]:
        answer = _Answer()
        for sse in events:
            if is_done_marker(sse):
                continue
            chunk = json_event(self, sse)
            if chunk.get('error'):
                said = _error_text(chunk)
                raise self.error(f'Gemini reported an error mid-stream: {said}; the reply was not saved, try again',
                                 chunk, quoted=said)
            self._check_not_blocked(chunk)
            yield from answer.add(chunk)
        if answer.finish is None:
            raise self.error('the Gemini stream ended before any chunk carried a finishReason, so the '
                             'reply is incomplete; try again', answer.response() if answer.chunks else None)
        yield self.done(self.parse_response(answer.response()))


class _Answer:
    """One GenerateContentResponse rebuilt from the chunks of a stream."""

    def __init__(self) -> None:
        self.chunks = 0
        self.parts: list[dict] = []
        self.finish = None
        self.top: dict = {}         # everything but the candidates, latest value of each key

    def add(self, chunk: dict) -> Iterator[Event]:
        self.chunks += 1
        self.top.update((k, v) for k, v in chunk.items() if k != 'candidates' and v)
        candidate = (chunk.get('candidates') or [{}])[0]
        if not isinstance(candidate, dict):
            return
        self.finish = candidate.get('finishReason') or self.finish
        for part in (candidate.get('content') or {}).get('parts') or ():
            if not isinstance(part, dict):
                continue
            text = part.get('text') or ''
            if text:
                yield Event('thinking' if part.get('thought') else 'text', text=text)
            self._merge(part)

    def _merge(self, part: dict) -> None:
        last = self.parts[-1] if self.parts else None
        if last is not None and 'text' in part and 'text' in last and bool(last.get('thought')) == bool(
                part.get('thought')):
            merged = {**last, **part, 'text': (last['text'] or '') + (part['text'] or '')}
            self.parts[-1] = merged
        else:
            self.parts.append(dict(part))

    def response(self) -> dict:
        response = dict(self.top)
        candidate = {'content': {'role': 'model', 'parts': self.parts}, 'index': 0}
        if self.finish:
            candidate['finishReason'] = self.finish
        response['candidates'] = [candidate]
        return response


def _turn_contents(user: str, steps: list[dict], attached: tuple = ()) -> list[dict]:
    """One turn: the user's attachments and text, each round's model parts, one functionResponse per call."""
    contents: list[dict[str, Any]] = [{'role': 'user', 'parts': [_attachment_part(a) for a in attached]
                                       + [{'text': user}]}]
    reply = plain_reply(steps)
    if reply is not None:
        return contents + [{'role': 'model', 'parts': [{'text': reply}]}]
    names: dict[str, dict] = {}
    for said, answers in mod_items.rounds(steps):
        parts = [_part(item) for item in said]
        parts = [p for p in parts if p is not None] or [{'text': nonempty('')}]
        names.update((c['call_id'], c) for c in mod_items.calls(said))
        contents.append({'role': 'model', 'parts': parts})
        if answers:
            contents.append({'role': 'user', 'parts': [_response(a, names.get(a['call_id'])) for a in answers]})
    return contents


def _attachment_part(attachment) -> dict:
    if attachment.url:
        return {'fileData': {'mimeType': attachment.media_type, 'fileUri': attachment.url}}
    return {'inlineData': {'mimeType': attachment.media_type, 'data': attachment.base64}}


def _part(item: dict) -> dict | None:
    if 'native' in item:
        return item['native']
    if item['kind'] == mod_items.CALL:
        return {'functionCall': {'name': item['name'], 'args': item['arguments']}}
    if item['kind'] in (mod_items.TEXT, mod_items.REFUSAL):
        return {'text': nonempty(item['text'])}
    return None


def _response(item: dict, call: dict | None) -> dict:
    native = ((call or {}).get('native') or {}).get('functionCall') or {}
    key = 'error' if item['is_error'] else 'output'
    response: dict[str, Any] = {'name': (call or {}).get('name', ''), 'response': {key: item['output']}}
    if native.get('id'):
        response['id'] = native['id']
    return {'functionResponse': response}


def _step(part: dict) -> dict:
    """A part as a canonical item; a part that carries a signature keeps its native."""
    call = part.get('functionCall')
    if isinstance(call, dict):
        call_id = call.get('id') or f'call_{uuid.uuid4().hex[:24]}'
        return mod_items.call(call_id, call.get('name') or '', call.get('args') or {}, native=part)
    if 'text' in part:
        return mod_items.text(part.get('text') or '', native=part if part.get('thoughtSignature') else None)
    return mod_items.hosted(part)       # executableCode, codeExecutionResult and the like


def _declaration(tool) -> dict:
    declaration = {'name': tool.name, 'parametersJsonSchema': tool.parameters}
    if tool.description:
        declaration['description'] = tool.description
    return declaration


def _error_text(body: Any) -> str:
    error = body.get('error') if isinstance(body, dict) else None
    if isinstance(error, dict):
        return f'{error.get("status") or error.get("code")}: {error.get("message", "no message")}'
    return str(error or body)[:200]


def _usage(usage: dict) -> dict:
    """Reply's counts from Gemini's usageMetadata; its implicit cache writes are not reported."""
    thoughts = tokens(usage, 'thoughtsTokenCount')
    # promptTokenCount already includes the cached part. Thinking is billed as output, as Claude's
    # and OpenAI's output counts include it, so it is added to the candidates' count.
    return {'input_tokens': tokens(usage, 'promptTokenCount'),
            'output_tokens': tokens(usage, 'candidatesTokenCount') + thoughts,
            'cache_read_tokens': tokens(usage, 'cachedContentTokenCount'), 'reasoning_tokens': thoughts}
