"""The fake Gemini API: ``models/{model}:generateContent``, ``:streamGenerateContent`` and ``GET models``.

With ``generationConfig.thinkingConfig.includeThoughts`` and a last user text
starting with ``think:``, the reply opens with a ``thought: true`` part.
"""

from __future__ import annotations

from typing import Any

from llmconn.testing.fake_common import (
    THINK_PREFIX, ApiError, Call, JSONAnswer, StreamAnswer, count_words, new_id, reply_text,
    require_json_object, text_chunks)

NAME = 'gemini'
MODELS = ('gemini-2.5-flash', 'gemini-2.5-pro')
ROLES = ('user', 'model')

_STATUSES = {
    400: 'INVALID_ARGUMENT', 401: 'UNAUTHENTICATED', 403: 'PERMISSION_DENIED', 404: 'NOT_FOUND',
    409: 'ABORTED', 429: 'RESOURCE_EXHAUSTED', 499: 'CANCELLED', 500: 'INTERNAL', 503: 'UNAVAILABLE',
    504: 'DEADLINE_EXCEEDED',
}


def error_body(status: int, message: str = '') -> dict:
    name = _STATUSES.get(status, 'INTERNAL' if status >= 500 else 'INVALID_ARGUMENT')
    return {'error': {'code': status, 'message': message or name.replace('_', ' ').capitalize(),
                      'status': name}}


def error(status: int, message: str) -> ApiError:
    return ApiError(status, error_body(status, message))


def auth_ok(call: Call, api_key: str) -> bool:
    return api_key in (call.headers.get('x-goog-api-key'), call.query.get('key'))


def models(call: Call) -> JSONAnswer:
    data = [{'name': f'models/{m}', 'displayName': m,
             'supportedGenerationMethods': ['generateContent', 'countTokens']} for m in MODELS]
    return JSONAnswer(200, {'models': data})


def _parts_text(content: Any, thoughts: bool = False) -> str:
    parts = content.get('parts') if isinstance(content, dict) else None
    if not isinstance(parts, list):
        return ''
    return '\n'.join(p['text'] for p in parts if isinstance(p, dict) and isinstance(p.get('text'), str)
                     and bool(p.get('thought')) == thoughts)


def _validate(body: dict) -> list:
    contents = body.get('contents')
    if not isinstance(contents, list) or not contents:
        raise error(400, '* GenerateContentRequest.contents: contents is not specified\n')
    for content in contents:
        role = content.get('role', 'user') if isinstance(content, dict) else None
        if role not in ROLES:
            raise error(400, 'Please use a valid role: user, model.')
    return contents


def generate_content(call: Call) -> JSONAnswer | StreamAnswer:
    body = require_json_object(call, error)
    contents = _validate(body)
    users = [_parts_text(c) for c in contents if c.get('role', 'user') == 'user']
    system = _parts_text(body.get('systemInstruction') or body.get('system_instruction'))
    text = reply_text(users, bool(system))
    parts = [{'text': text}]
    thinking = ((body.get('generationConfig') or {}).get('thinkingConfig') or {}).get('includeThoughts')
    last_user = users[-1] if users else ''
    if thinking and last_user.startswith(THINK_PREFIX):
        parts.insert(0, {'text': f'Thinking about: {last_user[len(THINK_PREFIX):].strip()}', 'thought': True})
    prompt = count_words(system, *(_parts_text(c) for c in contents))
    usage = {'promptTokenCount': prompt, 'candidatesTokenCount': count_words(text),
             'totalTokenCount': prompt + count_words(*(p['text'] for p in parts)),
             'promptTokensDetails': [{'modality': 'TEXT', 'tokenCount': prompt}]}
    if len(parts) > 1:
        usage['thoughtsTokenCount'] = count_words(parts[0]['text'])
    head = {'modelVersion': call.params['model'], 'responseId': new_id('')}
    if call.params['method'] == 'streamGenerateContent':
        return _stream(head, parts, usage, sse=call.query.get('alt') == 'sse')
    candidate = {'content': {'parts': parts, 'role': 'model'}, 'finishReason': 'STOP', 'index': 0}
    return JSONAnswer(200, dict(head, candidates=[candidate], usageMetadata=usage))


def _stream(head: dict, parts: list, usage: dict, sse: bool) -> JSONAnswer | StreamAnswer:
    pieces = [dict(part, text=t) for part in parts for t in text_chunks(part['text'])]
    opening = {'promptTokenCount': usage['promptTokenCount'], 'totalTokenCount': usage['promptTokenCount']}
    chunks = []
    for i, piece in enumerate(pieces):
        candidate = {'content': {'parts': [piece], 'role': 'model'}, 'index': 0}
        last = i == len(pieces) - 1
        if last:
            candidate['finishReason'] = 'STOP'
        chunks.append(dict(head, candidates=[candidate], usageMetadata=usage if last else opening))
    if not sse:
        # Without alt=sse the real API streams one JSON array; the whole array is what a client sees.
        return JSONAnswer(200, chunks)
    failure = [('', error_body(500, 'An internal error has occurred. Please retry or report in '
                                    'https://developers.generativeai.google/guide/troubleshooting'))]
    return StreamAnswer([('', c) for c in chunks], 0, failure)


def route_model(path_rest: str) -> tuple[str, str] | None:
    """``gemini-2.5-flash:generateContent`` -> (model, method), or None for another method."""
    model, _, method = path_rest.partition(':')
    if model and method in ('generateContent', 'streamGenerateContent'):
        return model, method
    return None

