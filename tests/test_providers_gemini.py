"""Gemini generateContent mapping, checked against the documented REST shape.

There is no Gemini SDK among the test dependencies, so the request shape is
checked explicitly: the top-level fields the API knows, ``contents`` whose
roles alternate ``user``/``model`` and end with the user, and parts that are
``{"text": str}``.
"""

from __future__ import annotations

import json

import pytest

from llmconn.errors import ConfigError, InvalidInput, LLMError
from llmconn.providers.base import SSE, STREAM, SYSTEM, TOOLS, STRUCTURED
from llmconn.types import Request, Turn

from provider_helpers import SECRET, make_provider, run_stream, same_answer

# GenerateContentRequest's top-level fields (ai.google.dev/api/generate-content).
REQUEST_FIELDS = {'contents', 'tools', 'toolConfig', 'safetySettings', 'systemInstruction', 'generationConfig',
                  'cachedContent'}
GENERATION_FIELDS = {'stopSequences', 'responseMimeType', 'responseSchema', 'candidateCount', 'maxOutputTokens',
                     'temperature', 'topP', 'topK', 'seed', 'presencePenalty', 'frequencyPenalty',
                     'responseLogprobs', 'logprobs', 'thinkingConfig'}


def gemini(**fields):
    fields.setdefault('model', 'gemini-2.5-flash')
    return make_provider('gemini', **fields)


def assert_valid_body(body: dict) -> None:
    assert set(body) <= REQUEST_FIELDS, set(body) - REQUEST_FIELDS
    roles = [c['role'] for c in body['contents']]
    assert roles == ['user', 'model'] * (len(roles) // 2) + ['user']
    for content in body['contents'] + ([body['systemInstruction']] if 'systemInstruction' in body else []):
        assert set(content) <= {'role', 'parts'} and content['parts']
        for part in content['parts']:
            assert set(part) == {'text'} and isinstance(part['text'], str)
    assert set(body['generationConfig']) <= GENERATION_FIELDS
    assert isinstance(body['generationConfig']['maxOutputTokens'], int)
    json.dumps(body)


def response(text='Hello Ann', thought=None, finish='STOP', usage=(9, 3)) -> dict:
    parts = ([{'text': thought, 'thought': True}] if thought else []) + ([{'text': text}] if text else [])
    return {'candidates': [{'content': {'role': 'model', 'parts': parts}, 'finishReason': finish, 'index': 0}],
            'usageMetadata': {'promptTokenCount': usage[0], 'candidatesTokenCount': usage[1],
                              'totalTokenCount': sum(usage)},
            'modelVersion': 'gemini-2.5-flash', 'responseId': 'resp-1'}


def stream(*pieces, finish='STOP', usage=(9, 3)) -> list[SSE]:
    """One chunk per (kind, text) piece; the last chunk carries finishReason and usage, as Gemini does."""
    chunks = []
    for index, (kind, text) in enumerate(pieces):
        part = {'text': text, 'thought': True} if kind == 'thinking' else {'text': text}
        candidate = {'content': {'role': 'model', 'parts': [part]}, 'index': 0}
        chunk = {'candidates': [candidate], 'modelVersion': 'gemini-2.5-flash', 'responseId': 'resp-1',
                 'usageMetadata': {'promptTokenCount': usage[0]}}
        if index == len(pieces) - 1 and finish:
            candidate['finishReason'] = finish
            chunk['usageMetadata'] = {'promptTokenCount': usage[0], 'candidatesTokenCount': usage[1],
                                      'totalTokenCount': sum(usage)}
        chunks.append(SSE(('', json.dumps(chunk))))
    return chunks


# ---- configuration and request bodies


def test_urls_headers_and_capabilities():
    provider = gemini(address='http://127.0.0.1:9/v1beta')
    assert provider.url() == 'http://127.0.0.1:9/v1beta/models/gemini-2.5-flash:generateContent'
    assert provider.url(stream=True) == ('http://127.0.0.1:9/v1beta/models/gemini-2.5-flash'
                                         ':streamGenerateContent?alt=sse')
    assert provider.ping_url() == 'http://127.0.0.1:9/v1beta/models'
    assert provider.headers() == {'content-type': 'application/json', 'x-goog-api-key': SECRET}
    assert provider.capabilities == {STREAM, SYSTEM, TOOLS, STRUCTURED}
    assert gemini().conf.address == 'https://generativelanguage.googleapis.com/v1beta'


def test_model_given_as_resource_name_is_not_prefixed_twice():
    assert gemini(model='tunedModels/my-model').url().endswith('/v1beta/tunedModels/my-model:generateContent')


def test_secret_not_in_reprs():
    provider = gemini()
    assert SECRET not in repr(provider.conf) and SECRET not in repr(provider.__dict__)
    assert SECRET not in provider.url() and SECRET not in provider.url(stream=True)   # never ?key=


def test_minimal_body():
    body = gemini().build_request(Request(text='Hello'))
    assert body == {'contents': [{'role': 'user', 'parts': [{'text': 'Hello'}]}],
                    'generationConfig': {'maxOutputTokens': 1024}}
    assert_valid_body(body)


def test_system_instruction_history_roles_and_no_stream_flag():
    history = (Turn('my name is Ann', 'Hello Ann'), Turn('I like tea', 'Noted'))
    body = gemini().build_request(Request(text='what is my name?', system='Be brief.', history=history,
                                          stream=True))
    assert body['systemInstruction'] == {'parts': [{'text': 'Be brief.'}]}
    assert [(c['role'], c['parts'][0]['text']) for c in body['contents']] == [
        ('user', 'my name is Ann'), ('model', 'Hello Ann'), ('user', 'I like tea'), ('model', 'Noted'),
        ('user', 'what is my name?')]
    assert 'stream' not in body      # streaming is chosen by the URL
    assert_valid_body(body)


def test_generation_config_params_merge_key_by_key():
    provider = gemini(params={'generationConfig': {'temperature': 0.2, 'topK': 3},
                              'safetySettings': [{'category': 'HARM_CATEGORY_HARASSMENT',
                                                  'threshold': 'BLOCK_NONE'}]})
    body = provider.build_request(Request(text='hi', params={'generationConfig': {'temperature': 0.9}}))
    assert body['generationConfig'] == {'maxOutputTokens': 1024, 'temperature': 0.9}
    assert body['safetySettings'][0]['threshold'] == 'BLOCK_NONE'
    body = provider.build_request(Request(text='hi'))
    assert body['generationConfig'] == {'maxOutputTokens': 1024, 'temperature': 0.2, 'topK': 3}
    assert_valid_body(body)


def test_params_may_not_replace_what_llmconn_owns():
    with pytest.raises(InvalidInput, match='contents'):
        gemini().build_request(Request(text='hi', params={'contents': []}))
    with pytest.raises(ConfigError, match='systemInstruction'):
        gemini(params={'systemInstruction': {'parts': [{'text': 'x'}]}})


def test_thinking_config_is_refused_at_load():
    with pytest.raises(ConfigError, match='thinking'):
        gemini(thinking={'type': 'adaptive'})


# ---- responses


def test_parse_response_text_thinking_and_usage():
    body = response(thought='She said her name.')
    body['usageMetadata']['thoughtsTokenCount'] = 5
    reply = gemini().parse_response(body)
    assert (reply.text, reply.thinking) == ('Hello Ann', 'She said her name.')
    assert (reply.input_tokens, reply.output_tokens) == (9, 3 + 5)
    assert reply.raw is body and reply.items == () and reply.model == 'gemini-2.5-flash'
    assert reply.response_id == 'resp-1'


def test_blocked_prompt_raises_a_clear_error():
    body = {'promptFeedback': {'blockReason': 'SAFETY', 'safetyRatings': []},
            'usageMetadata': {'promptTokenCount': 4, 'totalTokenCount': 4}}
    with pytest.raises(LLMError, match='blocked the prompt.*SAFETY') as info:
        gemini().parse_response(body)
    assert info.value.provider_body == body


def test_answer_stopped_for_safety_without_text_raises():
    with pytest.raises(LLMError, match='finishReason SAFETY'):
        gemini().parse_response(response(text='', finish='SAFETY'))


def test_empty_candidates_raise():
    with pytest.raises(LLMError, match='without any candidate'):
        gemini().parse_response({'candidates': [], 'usageMetadata': {'promptTokenCount': 3}})


def test_truncated_answer_with_text_is_a_reply():
    assert gemini().parse_response(response(finish='MAX_TOKENS')).text == 'Hello Ann'


def test_error_body_raises():
    body = {'error': {'code': 400, 'message': 'API key not valid', 'status': 'INVALID_ARGUMENT'}}
    with pytest.raises(LLMError, match='INVALID_ARGUMENT: API key not valid'):
        gemini().parse_response(body)


# ---- streaming


def test_stream_deltas_then_done_equal_to_unstreamed():
    provider = gemini()
    deltas, reply = run_stream(provider, stream(('thinking', 'She said '), ('thinking', 'her name.'),
                                                ('text', 'Hello'), ('text', ' Ann')))
    assert deltas == [('thinking', 'She said '), ('thinking', 'her name.'), ('text', 'Hello'), ('text', ' Ann')]
    assert same_answer(reply, provider.parse_response(response(thought='She said her name.')))
    assert (reply.input_tokens, reply.output_tokens) == (9, 3)


def test_stream_without_finish_reason_raises():
    with pytest.raises(LLMError, match='finishReason'):
        list(gemini().parse_stream(iter(stream(('text', 'Hello'), finish=None))))


def test_stream_without_chunks_raises():
    with pytest.raises(LLMError, match='finishReason') as info:
        list(gemini().parse_stream(iter([])))
    assert info.value.provider_body is None


def test_stream_blocked_prompt_raises():
    chunk = {'promptFeedback': {'blockReason': 'PROHIBITED_CONTENT'}, 'usageMetadata': {'promptTokenCount': 2}}
    with pytest.raises(LLMError, match='PROHIBITED_CONTENT'):
        list(gemini().parse_stream(iter([SSE(('', json.dumps(chunk)))])))


def test_stream_safety_stop_without_text_raises():
    events = [SSE(('', json.dumps({'candidates': [{'finishReason': 'SAFETY', 'index': 0}]})))]
    with pytest.raises(LLMError, match='SAFETY'):
        list(gemini().parse_stream(iter(events)))


def test_stream_error_chunk_raises():
    error = {'error': {'code': 503, 'message': 'The model is overloaded.', 'status': 'UNAVAILABLE'}}
    with pytest.raises(LLMError, match='overloaded') as info:
        list(gemini().parse_stream(iter(stream(('text', 'Hi'))[:1] + [SSE(('', json.dumps(error)))])))
    assert info.value.provider_body == error
