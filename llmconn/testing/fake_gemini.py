"""The fake Gemini API: ``models/{model}:generateContent``, ``:streamGenerateContent`` and ``GET models``.

With ``generationConfig.thinkingConfig.includeThoughts`` and a last user text
starting with ``think:``, the reply opens with a ``thought: true`` part.

Tools (see :mod:`llmconn.testing.fake_tools`): calls come as ``functionCall``
parts without ids, each carrying a ``thoughtSignature`` as thinking models
give them. As Gemini 3 does, every function call of the current turn (since
the last user text) must come back with its signature intact, and a
function-call content must be answered by as many ``functionResponse`` parts.

``toolConfig.functionCallingConfig`` is checked as Gemini checks it: its
``mode`` one of :data:`CALLING_MODES` (another is the API's 400 for an enum
value it does not know), ``allowedFunctionNames`` only with ``ANY`` or
``VALIDATED`` and only of declared functions, and a config that needs
functions only with declarations. ``NONE`` makes no calls; ``allowedFunctionNames``
limits the calls the model makes to those functions.
"""

from __future__ import annotations

import json
from typing import Any

from llmconn.testing.fake_cache import gemini_cached
from llmconn.testing.fake_common import (
    THINK_PREFIX, ApiError, Call, JSONAnswer, StreamAnswer, count_words, new_id, reply_text,
    require_json_object, text_chunks)
from llmconn.testing.fake_attachments import gemini_attached
from llmconn.testing.fake_structured import answer, gemini_format
from llmconn.testing.fake_tools import decide, signed_call, violation

NAME = 'gemini'
MODELS = ('gemini-2.5-flash', 'gemini-2.5-pro')
ROLES = ('user', 'model')
# FunctionCallingConfig.Mode; VALIDATED holds calls to their declarations' schemas (what strict asks for).
CALLING_MODES = ('MODE_UNSPECIFIED', 'AUTO', 'ANY', 'NONE', 'VALIDATED')
_NAMING_MODES = ('ANY', 'VALIDATED')     # the modes under which allowedFunctionNames may be set

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


def _parts(content: dict, key: str) -> list:
    parts = content.get('parts') if isinstance(content, dict) else None
    return [p for p in parts if isinstance(p, dict) and key in p] if isinstance(parts, list) else []


def _check_function_turns(contents: list, call: Call) -> None:
    """Signatures on the current turn's calls, and as many responses as calls."""
    texts = [i for i, c in enumerate(contents) if c.get('role', 'user') == 'user' and _parts(c, 'text')]
    current = texts[-1] if texts else 0
    for i, content in enumerate(contents):
        calls = _parts(content, 'functionCall') if content.get('role') == 'model' else []
        for position, part in enumerate(calls):
            function = part['functionCall'] if isinstance(part['functionCall'], dict) else {}
            signed = signed_call(function.get('name'), function.get('args') or {})
            if i > current and not call.state.signer.verify(signed, part.get('thoughtSignature')):
                raise violation(call, 'gemini: thought signature', error(
                    400, f'Function call is missing a thought_signature in functionCall parts. This is required '
                         f'for tools to work correctly, and missing thought_signature may lead to degraded model '
                         f'performance. Additional data, function call `default_api:{function.get("name")}` , '
                         f'position {position + 1}. Please refer to '
                         f'https://ai.google.dev/gemini-api/docs/thought-signatures for more details.'))
        following = contents[i + 1] if i + 1 < len(contents) else None
        if calls and following is not None and len(_parts(following, 'functionResponse')) != len(calls):
            raise violation(call, 'gemini: function responses', error(
                400, 'Please ensure that the number of function response parts is equal to the number of '
                     'function call parts of the function call turn.'))


def _callable(body: dict, declared: list) -> list:
    """The functions the model may call under the request's ``toolConfig``; a 400 for a config Gemini refuses."""
    tool_config = body.get('toolConfig', body.get('tool_config'))
    if tool_config is None:
        return declared
    if not isinstance(tool_config, dict):
        raise error(400, f"Invalid value at 'tool_config' "
                         f"(type.googleapis.com/google.ai.generativelanguage.v1beta.ToolConfig), "
                         f"{json.dumps(tool_config)}")
    config = tool_config.get('functionCallingConfig', tool_config.get('function_calling_config', {}))
    if not isinstance(config, dict):
        raise error(400, f"Invalid value at 'tool_config.function_calling_config' "
                         f"(type.googleapis.com/google.ai.generativelanguage.v1beta.FunctionCallingConfig), "
                         f"{json.dumps(config)}")
    mode = config.get('mode', 'MODE_UNSPECIFIED')
    if mode not in CALLING_MODES:
        raise error(400, f"Invalid value at 'tool_config.function_calling_config.mode' "
                         f"(type.googleapis.com/google.ai.generativelanguage.v1beta.FunctionCallingConfig.Mode), "
                         f"{json.dumps(mode)}")
    allowed = config.get('allowedFunctionNames', config.get('allowed_function_names'))
    if allowed is not None:
        if mode not in _NAMING_MODES:
            raise error(400, 'Function calling config allowed_function_names should only be set when the mode '
                             'is ANY or VALIDATED.')
        if not isinstance(allowed, list) or any(name not in declared for name in allowed):
            raise error(400, f'Function calling config allowed_function_names {json.dumps(allowed)} must name '
                             f'declared functions: {json.dumps(declared)}.')
    if mode in _NAMING_MODES and not declared:
        raise error(400, 'Function calling config is set without function_declarations.')
    if mode == 'NONE':
        return []
    return [name for name in declared if allowed is None or name in allowed]


def _response_text(part: dict) -> str:
    response = (part.get('functionResponse') or {}).get('response')
    if not isinstance(response, dict):
        return ''
    value = next(iter(response.values()), '') if len(response) == 1 else response
    return value if isinstance(value, str) else json.dumps(value, separators=(',', ':'))


def generate_content(call: Call) -> JSONAnswer | StreamAnswer:
    body = require_json_object(call, error)
    contents = _validate(body)
    _check_function_turns(contents, call)
    said = [c for c in contents if c.get('role', 'user') == 'user' and _parts(c, 'text')]
    users = [_parts_text(c) for c in said]
    attached = [gemini_attached(c.get('parts'), error) for c in said]
    outputs = [_response_text(p) for p in _parts(contents[-1], 'functionResponse')]
    declared = [d.get('name') for t in body.get('tools') or () if isinstance(t, dict)
                for d in t.get('functionDeclarations') or () if isinstance(d, dict)]
    system = _parts_text(body.get('systemInstruction') or body.get('system_instruction'))
    schema = gemini_format(body.get('generationConfig'), error)
    action = decide(users[-1] if users else '', outputs, _callable(body, declared))
    if isinstance(action, list):
        signer = call.state.signer
        parts = [{'functionCall': {'name': n, 'args': a}, 'thoughtSignature': signer.sign(signed_call(n, a))}
                 for n, a in action]
        text = ''
    else:
        text = action if isinstance(action, str) else reply_text(users, bool(system), attached)
        if schema is not None:      # Gemini has no refusal of its own: refused words come as the text
            text = ''.join(answer(schema, users[-1] if users else ''))
        parts = [{'text': text}]
    thinking = ((body.get('generationConfig') or {}).get('thinkingConfig') or {}).get('includeThoughts')
    last_user = users[-1] if users else ''
    if thinking and last_user.startswith(THINK_PREFIX) and not outputs and text:
        parts.insert(0, {'text': f'Thinking about: {last_user[len(THINK_PREFIX):].strip()}', 'thought': True})
    billed = gemini_cached(call.state.cache, call.params['model'], body, [system, *(_parts_text(c) for c in contents)])
    prompt = billed.total
    usage = {'promptTokenCount': prompt, 'candidatesTokenCount': count_words(text),
             'totalTokenCount': prompt + count_words(*(p.get('text', '') for p in parts)),
             'promptTokensDetails': [{'modality': 'TEXT', 'tokenCount': prompt}]}
    if billed.read:
        usage['cachedContentTokenCount'] = billed.read
    if parts[0].get('thought'):
        usage['thoughtsTokenCount'] = count_words(parts[0]['text'])
    head = {'modelVersion': call.params['model'], 'responseId': new_id('')}
    if call.params['method'] == 'streamGenerateContent':
        return _stream(head, parts, usage, sse=call.query.get('alt') == 'sse')
    candidate = {'content': {'parts': parts, 'role': 'model'}, 'finishReason': 'STOP', 'index': 0}
    return JSONAnswer(200, dict(head, candidates=[candidate], usageMetadata=usage))


def _stream(head: dict, parts: list, usage: dict, sse: bool) -> JSONAnswer | StreamAnswer:
    pieces = [dict(part, text=t) if 'text' in part else part
              for part in parts for t in (text_chunks(part['text']) if 'text' in part else [None])]
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

