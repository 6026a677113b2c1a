"""Manual tools (function=None): the turn waits, stored and unlocked, until tool_outputs answer it."""

from __future__ import annotations

import pytest

from llmconn import InvalidInput, Tool
from tests.tools_helpers import PROVIDERS, add, connection_config

APPROVE = Tool('approve', 'Ask a human to approve a refund.',
               {'type': 'object', 'properties': {'refund': {'type': 'integer'}}, 'required': ['refund']})


@pytest.fixture
def make(redis_url, provider, unique, open_registry):
    def make(kind, **conn):
        return open_registry(connection_config(redis_url, provider.url, unique, kind, lock_wait=0, **conn))[unique]
    return make


def pend(conn, chat_id='m'):
    reply = conn.chat('call approve {"refund": 10}; call add {"a": 1}', chat_id=chat_id, tools=[APPROVE, add])
    assert reply['stop_reason'] == 'tool_calls' and reply['text'] == ''
    manual, auto = reply['tool_calls']
    assert manual['name'] == 'approve' and 'output' not in manual
    assert auto['output'] == '2'        # the automatic tool of the same round already ran
    return manual['call_id']


@pytest.mark.parametrize('kind', PROVIDERS)
def test_a_manual_call_waits_and_tool_outputs_complete_the_turn(make, provider, kind):
    conn = make(kind)
    call_id = pend(conn)
    # The lock is free (lock_wait=0 would raise ChatBusy otherwise) and the pending turn is stored.
    assert conn.history('m')[1]['tool_calls'][0]['call_id'] == call_id
    reply = conn.chat(chat_id='m', tool_outputs={call_id: 'approved'}, tools=[APPROVE, add])
    assert reply['text'] == 'tool said: approved | 2'     # outputs go back in the order of the calls
    assert 'stop_reason' not in reply
    history = conn.history('m')
    assert len(history) == 2 and history[1]['content'] == reply['text']
    assert [c['output'] for c in history[1]['tool_calls']] == ['approved', '2']
    assert 'users: 2' in conn.chat('next', chat_id='m', tools=[APPROVE, add])['text']
    assert provider.violations == []


def test_a_manual_turn_completed_by_a_stream(make, provider):
    conn = make('claude')
    call_id = pend(conn)
    events = list(conn.stream(chat_id='m', tool_outputs={call_id: 'ok'}, tools=[APPROVE, add]))
    assert events[-1].type == 'done' and events[-1].result['text'].startswith('tool said:')


def test_new_text_while_calls_are_pending_is_refused_before_any_request(make, provider):
    conn = make('openai')
    pend(conn)
    provider.clear()
    with pytest.raises(InvalidInput, match='waits for the outputs'):
        conn.chat('something else', chat_id='m', tools=[APPROVE, add])
    assert provider.requests == []


@pytest.mark.parametrize('outputs', [{'call_nope': 'x'}, {}, 'x'])
def test_tool_outputs_must_answer_exactly_the_pending_ids(make, provider, outputs):
    conn = make('openai')
    call_id = pend(conn)
    provider.clear()
    with pytest.raises(InvalidInput):
        conn.chat(chat_id='m', tool_outputs=outputs)
    with pytest.raises(InvalidInput):
        conn.chat(chat_id='m', tool_outputs={call_id: 'x', 'extra': 'y'})
    with pytest.raises(InvalidInput, match='either text or tool_outputs'):
        conn.chat('text too', chat_id='m', tool_outputs={call_id: 'x'})
    assert provider.requests == []


def test_tool_outputs_without_a_pending_turn_or_chat_are_refused(make, provider):
    conn = make('openai')
    conn.chat('hello', chat_id='plain')
    provider.clear()
    with pytest.raises(InvalidInput, match='no pending'):
        conn.chat(chat_id='plain', tool_outputs={'c': 'x'})
    with pytest.raises(InvalidInput):
        conn.chat(tool_outputs={'c': 'x'})
    assert provider.requests == []
