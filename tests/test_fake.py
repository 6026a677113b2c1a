"""FakeConnection and FakeRegistry: the in-memory doubles services are unit-tested with."""

from __future__ import annotations

import pytest

from llmconn.errors import InvalidInput, LLMError, UnknownConnection
from llmconn.testing import FakeConnection, FakeRegistry
from llmconn.types import Event


def test_queued_replies_come_back_in_order_then_the_echo():
    conn = FakeConnection(['first', {'text': 'second', 'model': 'm1'}])
    assert conn.invoke('a')['text'] == 'first'
    second = conn.invoke('b')
    assert (second['text'], second['model']) == ('second', 'm1')
    assert second['usage'] == {'input_tokens': 1, 'output_tokens': 1, 'cache_read_tokens': 0, 'cache_write_tokens': 0, 'reasoning_tokens': 0}
    assert conn.invoke('c d', skill='helper')['text'] == 'echo: c d | users: 1 | previous: - | system: yes'


def test_a_queued_exception_is_raised_and_nothing_is_saved():
    error = LLMError('provider down', status=503)
    conn = FakeConnection([error])
    with pytest.raises(LLMError) as info:
        conn.chat('hi', chat_id='c1')
    assert info.value is error
    assert conn.history('c1') == []
    conn.add_reply(TimeoutError)
    with pytest.raises(TimeoutError):
        conn.chat('hi', chat_id='c1')


def test_calls_are_recorded():
    conn = FakeConnection()
    conn.chat('hi', chat_id='c1', skill='s', temperature=0.5)
    conn.invoke('yo')
    assert conn.calls == [
        {'method': 'chat', 'text': 'hi', 'chat_id': 'c1', 'skill': 's', 'params': {'temperature': 0.5}},
        {'method': 'invoke', 'text': 'yo', 'chat_id': '', 'skill': '', 'params': {}},
    ]


def test_chat_keeps_history_per_chat_and_the_echo_sees_it():
    conn = FakeConnection()
    conn.chat('my name is Ann', chat_id='c1')
    reply = conn.chat('what is my name?', chat_id='c1')
    assert reply['text'] == 'echo: what is my name? | users: 2 | previous: my name is Ann | system: no'
    assert conn.chat('hello', chat_id='c2')['text'].startswith('echo: hello | users: 1')
    assert conn.history('c1') == [
        {'role': 'user', 'content': 'my name is Ann'},
        {'role': 'assistant', 'content': 'echo: my name is Ann | users: 1 | previous: - | system: no'},
        {'role': 'user', 'content': 'what is my name?'},
        {'role': 'assistant', 'content': reply['text']},
    ]
    conn.delete_history('c1')
    assert conn.history('c1') == []
    assert conn.history('c2')


def test_chat_without_chat_id_is_invoke():
    conn = FakeConnection()
    conn.chat('one')
    assert conn.chat('two')['text'].startswith('echo: two | users: 1')


def test_the_echo_counts_only_the_window():
    conn = FakeConnection(max_history_turns=2)
    for text in ('a', 'b', 'c'):
        reply = conn.chat(text, chat_id='c')
    assert reply['text'] == 'echo: c | users: 2 | previous: b | system: no'
    assert len(conn.history('c')) == 6


def test_stream_yields_deltas_then_done_and_saves_the_turn():
    conn = FakeConnection([{'text': 'one two three four five', 'thinking': 'hmm'}])
    events = list(conn.stream('hi', chat_id='c'))
    assert all(isinstance(e, Event) for e in events)
    assert [e.type for e in events][0] == 'thinking' and events[-1].type == 'done'
    assert [e.type for e in events].count('done') == 1
    assert ''.join(e.text for e in events if e.type == 'text') == 'one two three four five'
    assert events[-1].result['text'] == 'one two three four five'
    assert conn.history('c')[-1]['content'] == 'one two three four five'


def test_stream_raises_a_queued_error_when_iterated():
    conn = FakeConnection([LLMError('boom')])
    events = conn.stream('hi')
    with pytest.raises(LLMError):
        next(events)


@pytest.mark.parametrize('call', [
    lambda c: c.invoke(''),
    lambda c: c.invoke('   '),
    lambda c: c.invoke(42),
    lambda c: c.chat('hi', chat_id=7),
    lambda c: c.chat('hi', chat_id='x' * 257),
    lambda c: c.stream(''),
    lambda c: c.history(''),
])
def test_bad_arguments_raise_invalid_input_before_anything_happens(call):
    conn = FakeConnection(['kept'])
    with pytest.raises(InvalidInput):
        call(conn)
    assert conn.replies[0] == 'kept'


def test_ping_returns_or_raises_what_it_is_told():
    conn = FakeConnection()
    assert conn.ping() is True
    conn.ping_result = LLMError('unreachable')
    with pytest.raises(LLMError):
        conn.ping()


def test_registry_looks_up_by_name():
    claude, gpt = FakeConnection(name='Claude'), FakeConnection(name='GPT')
    registry = FakeRegistry({'Claude': claude, 'GPT': gpt})
    assert registry['Claude'] is claude
    assert 'GPT' in registry and 'Gemini' not in registry
    assert len(registry) == 2 and list(registry) == ['Claude', 'GPT']
    with pytest.raises(UnknownConnection) as info:
        registry['Gemini']
    assert isinstance(info.value, KeyError)
    assert '"Claude"' in str(info.value) and '"GPT"' in str(info.value)
    registry.close()
    assert registry.closed and claude.closed and gpt.closed


BAD_CALLS = {
    'text-not-str': lambda c: c.invoke(123),
    'text-blank': lambda c: c.chat('  ', chat_id='a'),
    'text-too-long': lambda c: c.invoke('x' * 1_000_001),
    'text-lone-surrogate': lambda c: c.invoke('half \ud83d'),
    'chat-id-not-str': lambda c: c.chat('hi', chat_id=7),
    'chat-id-too-long': lambda c: c.stream('hi', chat_id='x' * 300),
    'skill-not-str': lambda c: c.invoke('hi', skill=123),
    'params-not-json': lambda c: c.invoke('hi', when=object()),
    'params-nan': lambda c: c.invoke('hi', temperature=float('nan')),
    'params-infinity': lambda c: c.chat('hi', chat_id='a', top_p=float('inf')),
    'params-reserved': lambda c: c.invoke('hi', model='other'),
    'params-reserved-messages': lambda c: c.stream('hi', messages=[]),
    'params-lone-surrogate': lambda c: c.invoke('hi', note='\udc00'),
    'history-empty-id': lambda c: c.history(''),
}


@pytest.mark.parametrize('call', BAD_CALLS.values(), ids=BAD_CALLS.keys())
def test_the_fake_refuses_exactly_what_the_real_connection_refuses(call, open_registry, provider):
    real = open_registry({'llm': [{'name': 'real', 'provider': 'claude', 'model': 'claude-sonnet-5-5',
                                   'address': provider.url, 'max_retries': 0}]})['real']
    with pytest.raises(InvalidInput) as real_error:
        call(real)
    fake = FakeConnection(['kept'], provider='claude')
    with pytest.raises(InvalidInput) as fake_error:
        call(fake)
    assert str(fake_error.value) == str(real_error.value)
    assert fake.replies[0] == 'kept' and provider.requests == []


# -- tools: the same signatures as a connection, and the same answers as one on the fake provider -----

def test_the_fake_takes_the_very_arguments_a_connection_takes():
    import inspect

    from llmconn.connection import Connection
    for name in ('invoke', 'chat', 'stream', 'ping', 'history', 'delete_history', 'close'):
        real, fake = inspect.signature(getattr(Connection, name)), inspect.signature(getattr(FakeConnection, name))
        assert fake == real, f'{name}: FakeConnection{fake} but Connection{real}'


def get_order(order_id: str) -> str:
    """Look up an order by its id."""
    return {'123': 'shipped'}[order_id]


def tool_session(conn) -> list:
    """The README's tool walk-through: an automatic tool, then a manual one answered later."""
    import llmconn
    seen = []
    reply = conn.chat('call get_order {"order_id": "123"}', chat_id='ann', tools=[get_order])
    seen.append(reply)
    refund = llmconn.Tool('refund', 'Ask a human to approve a refund.',
                          {'type': 'object', 'properties': {'amount': {'type': 'integer'}}})
    waiting = conn.chat('call refund {"amount": 10}', chat_id='bob', tools=[refund])
    seen.append(waiting)
    with pytest.raises(InvalidInput, match='waits for the outputs'):
        conn.chat('hello?', chat_id='bob', tools=[refund])
    with pytest.raises(InvalidInput, match='exactly the pending call ids'):
        conn.chat(chat_id='bob', tool_outputs={'nope': 'x'}, tools=[refund])
    call_id = waiting['tool_calls'][0]['call_id']
    seen.append(conn.chat(chat_id='bob', tool_outputs={call_id: 'approved'}, tools=[refund]))
    seen.append([e.type for e in conn.stream('call get_order {"order_id": "123"}', chat_id='cy',
                                             tools=[get_order])])
    return seen + [conn.history('ann'), conn.history('bob')]


def _without_ids(value):
    """``value`` with call ids (made by each provider, or by the fake) and usage left out."""
    if isinstance(value, dict):
        return {k: _without_ids(v) for k, v in value.items() if k not in ('call_id', 'usage', 'raw', 'model',
                                                                          'id', 'response_id', 'stop_reason')
                or k == 'stop_reason' and v == 'tool_calls'}
    if isinstance(value, list):
        return [_without_ids(v) for v in value if v not in ('thinking',)]
    return value


def test_tool_turns_of_the_fake_answer_as_a_connection_on_the_fake_provider_does(provider, open_registry, unique):
    # A name of its own: memory:// is one store per process, shared with other tests' 'ann' chats.
    registry = open_registry({'llm': [{'name': unique, 'provider': 'claude', 'model': 'claude-sonnet-5-5',
                                       'address': provider.url}]})
    real = tool_session(registry[unique])
    fake = tool_session(FakeConnection(name=unique))
    assert real[0]['text'] == fake[0]['text'] == 'tool said: shipped'
    assert real[2]['text'] == fake[2]['text'] == 'tool said: approved'
    assert _without_ids(fake) == _without_ids(real)


def test_bad_tools_and_tool_outputs_are_refused_as_a_connection_refuses_them():
    conn = FakeConnection()
    with pytest.raises(InvalidInput, match='tools must be a list'):
        conn.chat('hi', tools=get_order)
    with pytest.raises(InvalidInput, match='neither a callable'):
        conn.invoke('hi', tools=['get_order'])
    with pytest.raises(InvalidInput, match='either text or tool_outputs'):
        conn.chat('hi', chat_id='c', tool_outputs={'x': 'y'})
    with pytest.raises(InvalidInput, match='no pending tool calls'):
        conn.chat(chat_id='c', tool_outputs={'x': 'y'})
    assert conn.calls == []                     # refused before anything, as before any network call
    conn.chat('call get_order {"order_id": "123"}', tools=[get_order])
    assert conn.calls[-1]['tools'] == ['get_order']
