"""``Connection.run``: the one entry every provider call goes through, driven with a caller's own spec.

``invoke``, ``chat`` and ``stream`` are tested through their own files;
here are the spec fields only a caller that keeps its own conversation
(the gateway) uses, against the fake provider over HTTP, and the provider
hooks that carry what a provider kind means.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import llmconn
from llmconn import items as mod_items
from llmconn.errors import InvalidInput
from llmconn.gateway.capabilities import KINDS
from llmconn.providers import PROVIDERS
from llmconn.tools import Tool
from llmconn.types import CallSpec, Request
from tests.provider_helpers import make_provider

TEMPLATES = Path(__file__).resolve().parent.parent / 'etc' / 'templates'
ORDER = Tool('get_order', 'Look an order up', {'type': 'object', 'properties': {'order_id': {'type': 'string'}}})


def _registry(fake, conn: dict | None = None) -> llmconn.Registry:
    entry = {'name': 'C', 'provider': 'openai', 'model': 'gpt-4.1', 'address': f'{fake.url}/v1', 'max_retries': 0}
    entry.update(conn or {})
    return llmconn.Registry.from_dict({'redis': {'url': 'memory://pipeline'}, 'llm': [entry]})


def _drain(events) -> tuple[list, object]:
    seen = list(events)
    assert [e.type for e in seen].count('done') == 1 and seen[-1].type == 'done'
    return seen[:-1], seen[-1]


def test_a_stream_spec_on_a_provider_that_cannot_stream_gets_the_whole_answer_as_deltas(provider):
    registry = _registry(provider, {
        'name': 'T', 'provider': 'template', 'address': f'{provider.url}/v1/chat/completions',
        'request_template_file': str(TEMPLATES / 'chat-completions.request.j2'),
        'response_template_file': str(TEMPLATES / 'chat-completions.response.j2')})
    try:
        conn = registry['T']
        with pytest.raises(InvalidInput, match='does not support the capability "stream"'):
            conn.stream('hi')               # the library's own stream() still says so
        deltas, done = _drain(conn.run(CallSpec('tell me', stream=True)))
        assert [e.type for e in deltas] == ['text'] and deltas[0].text == done.result['text']
        assert 'stream' not in provider.requests[-1]['body']        # asked for whole
        assert done.reply.text == done.result['text'] and conn.calls.count == 0
    finally:
        registry.close()


def test_a_callers_own_conversation_is_sent_as_given(provider):
    registry = _registry(provider)
    try:
        conn = registry['C']
        earlier = llmconn.types.Turn('my name is Ann', 'hello Ann')
        _, done = _drain(conn.run(CallSpec('what is my name?', system='be brief', history=(earlier,))))
        messages = provider.requests[-1]['body']['messages']
        assert [m['role'] for m in messages] == ['system', 'user', 'assistant', 'user']
        assert messages[0]['content'] == 'be brief' and messages[1]['content'] == 'my name is Ann'
        assert done.result['usage'] == done.reply.usage and done.reply.input_tokens > 0
    finally:
        registry.close()


def test_calls_go_back_to_a_caller_that_runs_its_own_tools(provider):
    registry = _registry(provider)
    try:
        conn = registry['C']
        _, done = _drain(conn.run(CallSpec('call get_order {"order_id": "A-1"}', tools=[ORDER], run_tools=False)))
        assert done.result['stop_reason'] == 'tool_calls' and done.result['rounds'] == 1
        call = done.result['tool_calls'][0]
        assert call['name'] == 'get_order' and call['arguments'] == {'order_id': 'A-1'} and 'output' not in call
        # The caller answers: its calls and outputs are the turn in progress; only new calls are this call's.
        given = tuple(mod_items.calls(done.reply.steps)) + (mod_items.output(call['call_id'], 'shipped'),)
        _, after = _drain(conn.run(CallSpec('', tools=[ORDER], items=given, tag=conn.provider.tag,
                                            history=(llmconn.types.Turn('earlier', 'fine'),), run_tools=False)))
        sent = provider.requests[-1]['body']['messages']
        assert sent[-1] == {'role': 'tool', 'tool_call_id': call['call_id'], 'content': 'shipped'}
        assert 'tool_calls' not in after.result and after.result['text']
    finally:
        registry.close()


def test_a_spec_that_names_a_chat_and_brings_its_own_conversation_is_refused(provider):
    registry = _registry(provider)
    try:
        with pytest.raises(InvalidInput, match='not both'):
            registry['C'].run(CallSpec('hi', chat_id='c1', history=(llmconn.types.Turn('a', 'b'),)))
        assert provider.requests == [] and registry['C'].calls.count == 0
    finally:
        registry.close()


def test_a_stateless_call_to_a_stateful_responses_connection_keeps_nothing():
    provider = make_provider('openai-responses', state='provider')
    kept = provider.build_request(Request('hi'))
    assert kept['store'] is True and 'include' not in kept
    asked = provider.build_request(Request('hi', stateless=True, params={'reasoning': {'effort': 'low'}}))
    # Without store its reasoning items are only usable with their encrypted content: asked for.
    assert asked['store'] is False and asked['include'] == ['reasoning.encrypted_content']
    assert provider.keeps_state and not make_provider('openai-responses').keeps_state


def test_claude_with_thinking_needs_its_signed_thinking_before_answered_calls():
    bare = [mod_items.call('c1', 'get_order', {}), mod_items.output('c1', 'shipped')]
    signed = [mod_items.reasoning({'type': 'thinking', 'thinking': 't', 'signature': 's'})] + bare
    thinking = make_provider('claude', thinking={'type': 'enabled', 'budget_tokens': 1024}, max_tokens=2048)
    assert 'signed thinking' in thinking.lacks_replay(bare) and not thinking.lacks_replay(signed)
    assert not make_provider('claude').lacks_replay(bare)
    assert not any(make_provider(k).lacks_replay(bare) for k in ('openai', 'gemini', 'openai-responses'))


def test_the_capability_matrix_has_a_column_for_every_provider_and_no_other():
    assert KINDS == tuple(PROVIDERS)
