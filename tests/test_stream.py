"""stream() end to end for every provider: a real Redis, the fake provider over HTTP.

What a consumer of ``stream`` relies on: deltas in the provider's order,
exactly one ``done``, last, carrying what ``invoke`` returns; a chat turn
saved only once ``done`` is reached; and a stream that breaks, fails, or is
abandoned by its consumer saves nothing and frees the chat at once, while a
stream that is still being read keeps the chat locked however long it runs.
"""

from __future__ import annotations

import threading
import time

import anthropic.types
import openai.types.chat
import openai.types.responses
import pytest

from llmconn.sse import EventStream

from llmconn import InvalidInput, LLMError
from llmconn.providers.base import STREAM, SYSTEM
from llmconn.store.keys import chat_keys
from waiting import wait_until

PROVIDERS = ('claude', 'openai', 'gemini', 'openai-responses')

# Where each API lives under the fake server, and a model it knows.
API_PATH = {'claude': '', 'openai': '/v1', 'gemini': '/v1beta', 'openai-responses': '/v1'}
MODEL = {'claude': 'claude-sonnet-5-5', 'openai': 'gpt-4o-mini', 'gemini': 'gemini-2.5-flash',
         'openai-responses': 'gpt-4.1-mini'}

# The official SDK type of each provider's reply body (Gemini has no SDK installed here).
SDK_REPLY = {'claude': anthropic.types.Message, 'openai': openai.types.chat.ChatCompletion,
             'openai-responses': openai.types.responses.Response}




@pytest.fixture
def make(redis_url, provider, unique, open_registry):
    def make(kind, **conn):
        conf = {'name': unique, 'provider': kind, 'model': MODEL[kind], 'address': provider.url + API_PATH[kind],
                'max_retries': 0, **conn}
        return open_registry({'redis': {'url': redis_url}, 'llm': [conf]})[unique]

    return make


def drain(events) -> tuple[list, dict]:
    """All events as (type, text), after checking ``done`` is there exactly once and last."""
    events = list(events)
    types = [e.type for e in events]
    assert types.count('done') == 1 and types[-1] == 'done', types
    return [(e.type, e.text) for e in events[:-1]], events[-1].result


def lock_is_free(conn, chat_id: str, redis_client) -> bool:
    return not redis_client.exists(chat_keys(conn.name, chat_id).lock)


def user_texts(conn, chat_id: str) -> list[str]:
    return [m['content'] for m in conn.history(chat_id) if m['role'] == 'user']


# ---- what a stream yields


@pytest.mark.parametrize('kind', PROVIDERS)
def test_stream_is_text_deltas_then_one_done_equal_to_invoke(make, kind):
    conn = make(kind)
    deltas, result = drain(conn.stream('tell me something nice'))
    assert len(deltas) > 1 and all(t == 'text' for t, _ in deltas), deltas
    assert ''.join(text for _, text in deltas) == result['text']
    assert result['text'] == 'echo: tell me something nice | users: 1 | previous: - | system: no'
    unstreamed = conn.invoke('tell me something nice')
    # Same answer, same shape; only the provider's ids and timestamps in raw differ between two calls.
    assert result.keys() == unstreamed.keys()
    assert result['usage'] == unstreamed['usage']
    assert result['usage']['input_tokens'] > 0 and result['usage']['output_tokens'] > 0
    assert {k: v for k, v in result.items() if k not in ('raw', 'response_id')} == \
           {k: v for k, v in unstreamed.items() if k not in ('raw', 'response_id')}
    assert isinstance(result['raw'], dict) and result['raw'].keys() <= unstreamed['raw'].keys() | {'object'}
    if kind in SDK_REPLY:
        # The reply rebuilt from the stream is a valid reply body for the official SDK too.
        SDK_REPLY[kind].model_validate(result['raw'])


@pytest.mark.parametrize('kind', PROVIDERS)
def test_streamed_chat_saves_the_turn_only_when_done_is_reached(make, kind):
    conn = make(kind)
    conn.chat('first', chat_id='s')
    events = conn.stream('second', chat_id='s')
    seen = []
    for event in events:
        if event.type == 'done':
            break
        seen.append(event.text)
        assert user_texts(conn, 's') == ['first'], 'the turn was saved before the stream was complete'
    assert event.result['text'] == ''.join(seen)
    assert 'users: 2 | previous: first' in event.result['text']
    # done was handed out, so the turn is already stored, with the text exactly as streamed.
    assert conn.history('s')[-2:] == [{'role': 'user', 'content': 'second'},
                                      {'role': 'assistant', 'content': event.result['text']}]
    assert next(events, None) is None


def test_chat_completions_stream_asks_for_usage(make, provider):
    conn = make('openai')
    provider.clear()
    _, result = drain(conn.stream('count me'))
    body = provider.requests[-1]['body']
    assert body['stream'] is True and body['stream_options'] == {'include_usage': True}
    assert result['usage'] == {'input_tokens': 2, 'output_tokens': len(result['text'].split()),
                               'cache_read_tokens': 0, 'cache_write_tokens': 0, 'reasoning_tokens': 0}


def test_claude_stream_usage_is_message_start_input_and_message_delta_output(make):
    _, result = drain(make('claude').stream('one two three'))
    # message_start says 1 output token so far; message_delta's total replaces it.
    assert result['usage'] == {'input_tokens': 3, 'output_tokens': len(result['text'].split()),
                               'cache_read_tokens': 0, 'cache_write_tokens': 0, 'reasoning_tokens': 0}


def test_gemini_streams_from_stream_generate_content_as_sse(make, provider):
    conn = make('gemini')
    provider.clear()
    drain(conn.stream('hi'))
    request = provider.requests[-1]
    assert request['path'].endswith(':streamGenerateContent') and request['query'] == {'alt': 'sse'}


def test_stream_arguments_are_checked_at_the_call_before_any_request(make, provider):
    conn = make('openai')
    provider.clear()
    with pytest.raises(InvalidInput):
        conn.stream('')
    with pytest.raises(InvalidInput):
        conn.stream('ok', chat_id=7)
    assert provider.requests == []


def test_a_stream_never_iterated_sends_nothing_and_locks_nothing(make, provider, redis_client):
    conn = make('openai')
    provider.clear()
    events = conn.stream('never read', chat_id='lazy')
    assert provider.requests == [] and lock_is_free(conn, 'lazy', redis_client)
    events.close()
    assert conn.history('lazy') == []


def test_stream_on_a_provider_without_the_capability_is_invalid_input(make, provider):
    conn = make('openai')
    conn.provider.capabilities = frozenset({SYSTEM})   # as a provider that cannot stream would declare
    provider.clear()
    with pytest.raises(InvalidInput, match='"stream"'):
        conn.stream('hello')
    assert provider.requests == []
    assert conn.chat('hello')['text'].startswith('echo: hello')


def test_a_skill_on_a_provider_without_system_prompts_is_invalid_input(make, provider):
    conn = make('openai')
    conn.provider.capabilities = frozenset({STREAM})
    provider.clear()
    with pytest.raises(InvalidInput, match='"system"'):
        conn.stream('hello', skill='anything')
    assert provider.requests == []


def test_gemini_thoughts_stream_before_the_text(make):
    conn = make('gemini', params={'generationConfig': {'thinkingConfig': {'includeThoughts': True}}})
    deltas, result = drain(conn.stream('think: why?'))
    types = [t for t, _ in deltas]
    assert types[0] == 'thinking' and 'thinking' not in types[types.index('text'):]
    assert ''.join(text for t, text in deltas if t == 'thinking') == result['thinking'] == 'Thinking about: why?'
    assert ''.join(text for t, text in deltas if t == 'text') == result['text']
    unstreamed = conn.invoke('think: why?')
    assert [result[k] for k in ('text', 'thinking', 'usage')] == [unstreamed[k] for k in ('text', 'thinking', 'usage')]


# ---- streams that fail after HTTP 200


@pytest.mark.parametrize('fault', ['break', 'error'])
@pytest.mark.parametrize('kind', PROVIDERS)
def test_a_failed_stream_raises_saves_nothing_and_frees_the_chat(make, provider, redis_client, kind, fault):
    conn = make(kind, lock_wait=0)
    conn.chat('kept', chat_id='f')
    before = conn.history('f')
    provider.fail_stream(fault)
    received = []
    with pytest.raises(LLMError) as info:
        for event in conn.stream('lost', chat_id='f'):
            received.append(event)
    # The failure came after the answer had begun: the consumer already had a delta.
    assert received and all(e.type == 'text' for e in received)
    assert info.value.connection == conn.name
    if fault == 'error':
        assert info.value.provider_body, 'the provider\'s error event is kept for the caller'
    assert conn.history('f') == before
    assert lock_is_free(conn, 'f', redis_client)
    # lock_wait=0: ChatBusy here would mean the failed stream left its lock behind.
    assert 'users: 2 | previous: kept' in conn.chat('next', chat_id='f')['text']


# ---- consumers that stop early


def close_after_first_text(conn, chat_id):
    events = conn.stream('abandoned', chat_id=chat_id)
    first = next(e for e in events if e.type == 'text')
    events.close()
    return first


def break_out_of_for_loop(conn, chat_id):
    for event in conn.stream('abandoned', chat_id=chat_id):
        if event.type == 'text':
            return event


def drop_the_generator(conn, chat_id):
    events = conn.stream('abandoned', chat_id=chat_id)
    first = next(events)
    del events
    return first


def watch_provider_streams(conn) -> list:
    """Record when the connection opens and closes its HTTP streams to the provider."""
    seen = []
    post_stream = conn.transport.post_stream

    def events(answer):
        try:
            yield from answer.events
        finally:
            seen.append('closed')

    def watched(*args, **kwargs):
        seen.append('opened')
        answer = post_stream(*args, **kwargs)
        if not isinstance(answer, EventStream):
            seen.append('closed')
            return answer
        return EventStream(events(answer))

    conn.transport.post_stream = watched
    return seen


@pytest.mark.parametrize('stop', [close_after_first_text, break_out_of_for_loop, drop_the_generator])
@pytest.mark.parametrize('kind', PROVIDERS)
def test_a_consumer_that_stops_early_saves_nothing_and_frees_the_chat(make, redis_client, kind, stop):
    conn = make(kind, lock_wait=0)
    conn.chat('kept', chat_id='early')
    provider_streams = watch_provider_streams(conn)
    first = stop(conn, 'early')
    assert first.type == 'text' and first.text
    assert provider_streams == ['opened', 'closed'], 'the provider stream was left open'
    assert lock_is_free(conn, 'early', redis_client)
    assert user_texts(conn, 'early') == ['kept']
    assert 'users: 2 | previous: kept' in conn.chat('next', chat_id='early')['text']


# ---- the lock lasts as long as the stream


def test_a_slow_consumer_keeps_the_chat_locked_and_renewed_until_done(make, redis_client):
    conn = make('openai', lock_ttl=0.3, lock_wait=5)
    events = conn.stream('first', chat_id='slow')
    assert next(events).type == 'text'          # the lock is taken and the answer has begun
    second = {}
    waiter = threading.Thread(target=lambda: second.update(conn.chat('second', chat_id='slow')))
    waiter.start()
    time.sleep(1.0)                             # more than three lock_ttl: only renewal keeps the lock
    assert waiter.is_alive(), 'the second call did not wait for the stream still being read'
    assert redis_client.pttl(chat_keys(conn.name, 'slow').lock) > 0
    _, result = drain(events)
    waiter.join(5)
    assert 'users: 1' in result['text']
    assert 'users: 2 | previous: first' in second['text']
    assert user_texts(conn, 'slow') == ['first', 'second']


def test_a_slow_provider_keeps_the_chat_locked_and_the_first_stream_still_saves(make, provider):
    conn = make('claude', lock_ttl=0.2, lock_wait=5)
    provider.latency = 0.6                      # each answer starts three lock_ttl after its request
    results = {}

    def streamed():
        results['first'] = drain(conn.stream('first', chat_id='lat'))[1]

    before = len(provider.requests)
    first = threading.Thread(target=streamed)
    first.start()
    # At the provider, the first call holds the chat's lock (taken before its request) for its latency.
    wait_until(lambda: len(provider.requests) > before, 'the first call reached the provider')
    results['second'] = conn.chat('second', chat_id='lat')
    first.join(5)
    assert 'users: 1' in results['first']['text']
    assert 'users: 2 | previous: first' in results['second']['text']
    assert user_texts(conn, 'lat') == ['first', 'second']
