"""A spec's ``record`` (:mod:`llmconn.call_record`): told by ``Connection.run`` where a chat would be begun and saved.

The record here notes each call it gets, with what the provider had been
sent and what the caller had read by then, so each test can say that
``started`` came before the provider was reached, ``ended`` before the
caller had ``done``, and that exactly one ending followed, against the fake
provider over HTTP.
"""

from __future__ import annotations

import math

import pytest

import llmconn
from llmconn.errors import LLMError, StoreError
from llmconn.types import CallSpec

TEXT = 'tell me a long story about records and pipelines'


class NotedRecord:
    """A CallRecord that notes what it was told, when (provider requests sent, events the caller read)."""

    def __init__(self, provider, read: list, refuse: Exception | None = None) -> None:
        self.provider, self.read, self.refuse = provider, read, refuse
        self.notes: list[tuple] = []

    def _note(self, name: str, *args) -> None:
        self.notes.append((name, len(self.provider.requests), list(self.read), *args))

    def started(self) -> None:
        self._note('started')
        if self.refuse is not None:
            raise self.refuse

    def ended(self, result, reply) -> None:
        self._note('ended', result, reply)

    def failed(self, error) -> None:
        self._note('failed', error)

    def cancelled(self, usage) -> None:
        self._note('cancelled', usage)

    @property
    def names(self) -> list[str]:
        return [n[0] for n in self.notes]


@pytest.fixture
def registry(provider, unique):
    conns = [{'name': name, 'provider': 'openai', 'model': 'gpt-4.1', 'address': f'{provider.url}/v1',
              'max_retries': 0, **fields}
             for name, fields in (('C', {}), ('P', {'fallbacks': ['C']}))]
    reg = llmconn.Registry.from_dict({'redis': {'url': f'memory://{unique}'}, 'llm': conns})
    yield reg
    reg.close()


def run(conn, record, stream: bool, read: list, text: str = TEXT):
    for event in conn.run(CallSpec(text, stream=stream, record=record)):
        read.append(event.type)
    return read


@pytest.mark.parametrize('stream', [False, True], ids=['invoke-like', 'streamed'])
def test_started_before_the_provider_and_ended_before_done_goes_out(registry, provider, stream):
    read: list = []
    record = NotedRecord(provider, read)
    events = registry['C'].run(CallSpec(TEXT, stream=stream, record=record))
    assert record.notes == []               # nothing happens until the events are read
    for event in events:
        read.append(event.type)
    assert record.names == ['started', 'ended']
    (_, sent_at_start, read_at_start), (_, sent_at_end, read_at_end, result, reply) = record.notes
    assert sent_at_start == 0 and read_at_start == []
    assert sent_at_end == 1 and 'done' not in read_at_end and read[-1] == 'done'
    assert result['text'] == reply.text and result['connection'] == 'C' and reply.input_tokens > 0
    assert ('text' in read_at_end) is stream and registry['C'].calls.count == 0


@pytest.mark.parametrize('stream', [False, True], ids=['invoke-like', 'streamed'])
def test_a_provider_failing_before_its_first_event_is_recorded_failed(registry, provider, stream):
    provider.fail(500)
    record = NotedRecord(provider, [])
    with pytest.raises(LLMError) as raised:
        run(registry['C'], record, stream, [])
    assert record.names == ['started', 'failed'] and record.notes[1][3] is raised.value


def test_a_record_that_refuses_to_start_stops_the_call_before_the_provider(registry, provider):
    record = NotedRecord(provider, [], refuse=StoreError('the store is down'))
    with pytest.raises(StoreError):
        run(registry['C'], record, True, [])
    assert record.names == ['started'] and provider.requests == [] and registry['C'].calls.count == 0


def test_a_caller_that_leaves_mid_stream_is_recorded_cancelled_with_the_usage_estimated(registry, provider):
    read: list = []
    record = NotedRecord(provider, read)
    events = registry['C'].run(CallSpec(TEXT, stream=True, record=record))
    streamed = 0
    for event in events:
        read.append(event.type)
        streamed += len(event.text)
        if len(read) == 2:
            break
    assert record.names == ['started']
    events.close()
    assert record.names == ['started', 'cancelled']
    usage = record.notes[1][3]
    assert usage == {'input_tokens': 0, 'output_tokens': math.ceil(streamed / 4), 'total_tokens':
                     math.ceil(streamed / 4), 'estimated': True} and streamed > 0
    assert registry['C'].calls.count == 0


def test_a_caller_that_stops_after_done_has_nothing_more_recorded(registry, provider):
    record = NotedRecord(provider, [])
    events = registry['C'].run(CallSpec(TEXT, stream=True, record=record))
    for event in events:
        if event.type == 'done':
            break
    events.close()
    assert record.names == ['started', 'ended']


def test_a_failover_records_the_connection_that_answered(registry, provider):
    provider.fail(503)
    record = NotedRecord(provider, [])
    run(registry['P'], record, True, [])
    assert record.names == ['started', 'ended'] and record.notes[1][1] == 2
    assert record.notes[1][3]['connection'] == 'C'


def test_a_caller_that_leaves_after_a_round_answered_is_recorded_with_that_rounds_usage(registry, provider):
    def get_order(order_id: str) -> str:
        return f'order {order_id} shipped'

    record = NotedRecord(provider, [])
    events = registry['C'].run(CallSpec('call get_order {"order_id": "A-1"}', stream=True, tools=[get_order],
                                        record=record))
    seen = []
    for event in events:
        seen.append(event.type)
        if event.type == 'text':
            break
    events.close()
    assert seen[:2] == ['tool_call', 'tool_result'] and record.names == ['started', 'cancelled']
    first_round = provider.requests[0]
    usage = record.notes[1][3]
    assert 'estimated' not in usage and usage['input_tokens'] > 0 and usage['output_tokens'] > 0
    assert len(provider.requests) == 2 and first_round['path'] == '/v1/chat/completions'
