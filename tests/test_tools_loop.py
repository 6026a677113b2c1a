"""The tool loop end to end on every provider: the fake server, a real Redis, and the replay rules.

The fake provider calls the tools a message names (``call NAME {args}``) and
answers what their outputs said; it refuses, with the real 400s, any replay
that breaks its provider's rules and records it, so every test here also
asserts that no violation was recorded.
"""

from __future__ import annotations

import pytest

from llmconn import Tool, ToolLoopLimit
from tests.tools_helpers import PROVIDERS, add, connection_config, get_order


@pytest.fixture
def make(redis_url, provider, unique, open_registry):
    def make(kind, **conn):
        return open_registry(connection_config(redis_url, provider.url, unique, kind, **conn))[unique]
    return make


@pytest.fixture
def clean(provider):
    yield provider
    assert provider.violations == []


@pytest.mark.parametrize('kind', PROVIDERS)
def test_a_tool_turn_runs_the_function_and_answers_with_its_output(make, clean, kind):
    conn = make(kind)
    reply = conn.chat('call get_order {"order_id": "123"}', chat_id='u1', tools=[get_order])
    assert reply['text'] == 'tool said: shipped'
    assert reply['rounds'] == 2
    [call] = reply['tool_calls']
    assert (call['name'], call['arguments'], call['output'], call['is_error']) == (
        'get_order', {'order_id': '123'}, 'shipped', False)
    assert call['call_id']
    assert reply['usage']['input_tokens'] > 0 and reply['usage']['output_tokens'] >= 2
    # The whole turn is stored and replayed: the next call sees one earlier user message.
    history = conn.history('u1')
    assert history[1]['content'] == 'tool said: shipped' and history[1]['tool_calls'] == reply['tool_calls']
    again = conn.chat('and now?', chat_id='u1', tools=[get_order])
    assert 'users: 2 | previous: call get_order' in again['text'] and again['rounds'] == 1


@pytest.mark.parametrize('kind', PROVIDERS)
def test_parallel_calls_are_answered_in_order_in_one_round(make, clean, kind):
    conn = make(kind)
    reply = conn.chat('call get_order {"order_id": "123"}; call add {"a": 2, "b": 3}', chat_id='p',
                      tools=[get_order, add])
    assert reply['text'] == 'tool said: shipped | 5' and reply['rounds'] == 2
    assert [c['name'] for c in reply['tool_calls']] == ['get_order', 'add']
    assert len({c['call_id'] for c in reply['tool_calls']}) == 2
    assert 'users: 2' in conn.chat('next', chat_id='p', tools=[get_order, add])['text']


@pytest.mark.parametrize('kind', PROVIDERS)
def test_a_multi_round_loop_and_its_stream_events(make, clean, kind):
    def first(step: str) -> str:
        """Step one: tells the model what to call next."""
        return 'call add {"a": 40, "b": 2}'

    conn = make(kind)
    events = list(conn.stream('call first {"step": "x"}', chat_id='s', tools=[first, add]))
    types = [e.type for e in events]
    assert types.count('done') == 1 and types[-1] == 'done'
    assert [(e.type, e.call['name']) for e in events if e.call] == [
        ('tool_call', 'first'), ('tool_result', 'first'), ('tool_call', 'add'), ('tool_result', 'add')]
    assert events[types.index('tool_call')].call['arguments'] == {'step': 'x'}
    result = events[-1].result
    assert result['text'] == 'tool said: 42' and result['rounds'] == 3
    assert ''.join(e.text for e in events if e.type == 'text') == 'tool said: 42'
    unstreamed = conn.chat('call first {"step": "y"}', chat_id='s2', tools=[first, add])
    assert unstreamed.keys() == result.keys()


@pytest.mark.parametrize('kind', PROVIDERS)
def test_invoke_runs_the_loop_without_a_chat(make, clean, kind):
    reply = make(kind).invoke('call add {"a": 1}', tools=[add])
    assert reply['text'] == 'tool said: 2' and reply['tool_calls'][0]['output'] == '2'


@pytest.mark.parametrize('kind', PROVIDERS)
def test_a_failing_tool_and_invalid_arguments_go_back_as_error_outputs(make, clean, kind):
    def explode() -> str:
        """Always fails."""
        raise RuntimeError('the database is down')

    conn = make(kind)
    reply = conn.chat('call explode {}; call add {"a": "not a number"}', chat_id='e', tools=[explode, add])
    failed, invalid = reply['tool_calls']
    assert failed['is_error'] and 'the database is down' in failed['output']
    assert invalid['is_error'] and 'invalid arguments' in invalid['output'] and "'not a number'" in invalid['output']
    assert reply['text'].startswith('tool said: error: RuntimeError')


@pytest.mark.parametrize('kind', PROVIDERS)
def test_a_loop_past_max_tool_rounds_raises_and_saves_nothing(make, clean, kind):
    def again() -> str:
        """Asks for itself again."""
        return 'call again {}'

    conn = make(kind, max_tool_rounds=3)
    conn.chat('hello', chat_id='loop')
    with pytest.raises(ToolLoopLimit, match='max_tool_rounds'):
        conn.chat('call again {}', chat_id='loop', tools=[again])
    assert [m['content'] for m in conn.history('loop')][0::2] == ['hello']
    assert len(clean.requests) == 1 + 3


def test_a_tool_object_with_an_explicit_schema(make, clean):
    lookup = Tool('lookup', 'Find a word.', {'type': 'object', 'properties': {'word': {'type': 'string'}},
                                            'required': ['word'], 'additionalProperties': False},
                  lambda word: word.upper())
    reply = make('claude').invoke('call lookup {"word": "hi"}', tools=[lookup])
    assert reply['text'] == 'tool said: HI'
    body = clean.requests[0]['body']
    assert body['tools'] == [{'name': 'lookup', 'description': 'Find a word.', 'input_schema': lookup.parameters}]


def test_schema_from_type_hints_and_docstring(make, clean):
    make('openai').invoke('call add {"a": 1}', tools=[add])
    [tool] = clean.requests[0]['body']['tools']
    assert tool == {'type': 'function', 'function': {'name': 'add', 'description': 'Add two numbers.', 'parameters': {
        'type': 'object', 'properties': {'a': {'type': 'integer'}, 'b': {'type': 'integer', 'default': 1}},
        'required': ['a']}}}
