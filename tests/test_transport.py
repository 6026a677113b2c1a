"""Transport: retries, Retry-After, error translation, SSE parsing and secret redaction.

The ``server`` fixture (tests/scripted_server.py) answers each request
with the next response from a script and records what it received, so
every attempt is visible.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import time

import pytest

from llmconn.errors import LLMAuthError, LLMError, LLMRateLimited, LLMTimeout
from llmconn.sse import iter_sse
from llmconn.answers import parse_duration, rate_limit_wait
from llmconn.transport import Transport, parse_retry_after

SECRET = 'sk-test-transport-secret'


def make(max_retries=2, timeout=5.0):
    sleeps = []
    transport = Transport('conn', pool_size=4, timeout=timeout, max_retries=max_retries, secret=SECRET,
                          sleep=sleeps.append)
    return transport, sleeps


def test_429_with_retry_after_then_success(server):
    server.script = [(429, {'Retry-After': '3'}, b'{"error": {"message": "slow down"}}', 0),
                     (200, {}, b'{"ok": true}', 0)]
    transport, sleeps = make()
    assert transport.post(server.url + '/x', {}, {'a': 1}) == {'ok': True}
    assert sleeps == [3.0] and len(server.received) == 2
    assert server.received[0][2] == server.received[1][2] == b'{"a": 1}'


def test_a_request_goes_out_head_and_body_in_one_send_and_a_bodyless_one_still_goes(server, monkeypatch):
    # urllib3 sends the head, then the body: two syscalls (and segments) a provider call.
    sent: list[bytes] = []
    original = http.client.HTTPConnection.send
    monkeypatch.setattr(http.client.HTTPConnection, 'send', lambda conn, data: (sent.append(data),
                                                                                original(conn, data))[1])
    server.script = [(200, {}, b'{"ok": true}', 0), (200, {}, b'{"ok": 2}', 0), (200, {}, b'{"ok": 3}', 0)]
    transport, _ = make()
    for body in ({'a': 1}, {'b': 2}):
        assert transport.post(server.url + '/x', {}, body)['ok']
    assert len(sent) == 2 and all(data.startswith(b'POST /x HTTP/1.1') for data in sent)
    assert sent[0].endswith(b'\r\n\r\n{"a": 1}') and sent[1].endswith(b'\r\n\r\n{"b": 2}')
    assert [r[2] for r in server.received] == [b'{"a": 1}', b'{"b": 2}']
    assert transport.get(server.url + '/y', {}) == {'ok': 3}          # no body: the head alone
    assert sent[2].startswith(b'GET /y HTTP/1.1') and sent[2].endswith(b'\r\n\r\n')


def test_retry_after_ms_wins_over_retry_after(server):
    server.script = [(529, {'retry-after-ms': '250', 'Retry-After': '9'}, b'{}', 0), (200, {}, b'{}', 0)]
    transport, sleeps = make()
    transport.post(server.url, {}, {})
    assert sleeps == [0.25]


def test_persistent_5xx_gives_up_after_max_retries_plus_one(server):
    server.script = [(503, {}, b'{"error": {"message": "overloaded"}}', 0)] * 5
    transport, sleeps = make(max_retries=2)
    with pytest.raises(LLMError) as e:
        transport.post(server.url, {}, {})
    assert len(server.received) == 3 and len(sleeps) == 2
    assert all(0 <= s <= 8 for s in sleeps)
    assert e.value.status == 503 and e.value.provider_body == {'error': {'message': 'overloaded'}}
    assert 'overloaded' in str(e.value) and '3 attempts' in str(e.value)


@pytest.mark.parametrize('status', [400, 404, 422])
def test_validation_errors_are_not_retried(server, status):
    server.script = [(status, {}, b'{"error": {"message": "bad field"}}', 0)]
    transport, sleeps = make()
    with pytest.raises(LLMError) as e:
        transport.post(server.url, {}, {})
    assert len(server.received) == 1 and sleeps == [] and e.value.status == status


def test_auth_failure_is_not_retried_and_has_its_own_class(server):
    server.script = [(401, {}, b'{"error": {"message": "invalid x-api-key"}}', 0)]
    transport, _ = make()
    with pytest.raises(LLMAuthError):
        transport.post(server.url, {}, {})
    assert len(server.received) == 1


def test_rate_limit_exhausted_is_rate_limited(server):
    server.script = [(429, {'Retry-After': '0'}, b'{}', 0)] * 3
    transport, _ = make(max_retries=2)
    with pytest.raises(LLMRateLimited):
        transport.post(server.url, {}, {})
    assert len(server.received) == 3


def test_timeout_is_llm_timeout_and_not_retried(server):
    server.script = [(200, {}, b'{}', 1.0)]
    transport, _ = make(timeout=0.2)
    with pytest.raises(LLMTimeout, match='0.2 s'):
        transport.post(server.url, {}, {})
    assert len(server.received) == 1


def test_non_json_body_is_llm_error(server):
    server.script = [(200, {'content-type': 'text/html'}, b'<html>proxy login</html>', 0)]
    transport, _ = make()
    with pytest.raises(LLMError, match='not JSON') as e:
        transport.post(server.url, {}, {})
    assert e.value.status == 200 and 'proxy login' in e.value.provider_body


def test_unreachable_provider_is_llm_error_after_retries():
    transport, sleeps = make(max_retries=1)
    with pytest.raises(LLMError, match='cannot reach'):
        transport.post('http://127.0.0.1:9/v1', {}, {})
    assert len(sleeps) == 1


def test_secret_is_redacted_from_errors(server):
    server.script = [(400, {}, json.dumps({'error': {'message': f'key {SECRET} is malformed'}}).encode(), 0)]
    transport, _ = make()
    with pytest.raises(LLMError) as e:
        transport.post(server.url, {'x-api-key': SECRET}, {})
    assert SECRET not in str(e.value) and SECRET not in repr(transport)


def test_retry_after_parsing():
    assert parse_retry_after({'retry-after': '1.5'}) == 1.5
    assert parse_retry_after({}) is None
    soon = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 < parse_retry_after({'retry-after': soon}) <= 30
    assert parse_retry_after({'retry-after': 'whenever'}) is None


def test_a_rate_limited_answers_wait_falls_back_to_openais_reset_of_a_spent_counter():
    assert [parse_duration(v) for v in ('20ms', '1s', '6m0s', '1h2m3.5s')] == [0.02, 1.0, 360.0, 3723.5]
    assert [parse_duration(v) for v in ('', 's', '5', '1s junk', '-1s')] == [None] * 5
    spent_tokens = {'x-ratelimit-remaining-requests': '4', 'x-ratelimit-reset-requests': '1s',
                    'x-ratelimit-remaining-tokens': '0', 'x-ratelimit-reset-tokens': '6m0s'}
    assert rate_limit_wait(spent_tokens) == 360.0      # the spent counter's reset, not the other's
    assert rate_limit_wait({**spent_tokens, 'x-ratelimit-remaining-requests': '0'}) == 360.0    # the later
    assert rate_limit_wait({**spent_tokens, 'retry-after': '3'}) == 3.0     # Retry-After wins
    assert rate_limit_wait({**spent_tokens, 'x-ratelimit-remaining-tokens': '7'}) is None    # none is spent
    assert rate_limit_wait({}) is None


def test_sse_parser_handles_split_chunks_comments_and_multiline_data():
    raw = b'event: a\ndata: {"x":\ndata: 1}\n\n: keep-alive\n\ndata: [DONE]\n\n'
    chunks = [raw[i:i + 3] for i in range(0, len(raw), 3)]
    events = list(iter_sse(chunks))
    assert events == [('a', '{"x":\n1}'), ('', '[DONE]')]
    assert events[0].event == 'a' and json.loads(events[0].data) == {'x': 1}


def test_stream_yields_events_in_order(server):
    body = 'event: one\ndata: 1\n\nevent: two\ndata: 2\n\n'.encode()
    server.script = [(200, {'content-type': 'text/event-stream'}, body, 0)]
    transport, _ = make()
    assert [tuple(e) for e in transport.post_stream(server.url, {}, {}).events] == [('one', '1'), ('two', '2')]


def test_proxy_environment_is_read_once_per_connection(monkeypatch):
    monkeypatch.setenv('HTTPS_PROXY', 'http://proxy.internal:3128')
    monkeypatch.setenv('NO_PROXY', 'localhost,127.0.0.1')
    monkeypatch.setenv('REQUESTS_CA_BUNDLE', '/etc/ssl/corp.pem')
    remote = Transport('r', pool_size=1, timeout=5, max_retries=0, address='https://api.anthropic.com')
    local = Transport('l', pool_size=1, timeout=5, max_retries=0, address='http://127.0.0.1:11434/v1')
    assert remote.proxy == 'http://proxy.internal:3128'
    assert remote.ca_certs == '/etc/ssl/corp.pem'
    assert local.proxy is None
    # No environment scan per request: the answer was settled above, and stays.
    monkeypatch.delenv('HTTPS_PROXY')
    assert remote.proxy == 'http://proxy.internal:3128'


def test_secret_is_masked_inside_a_json_error_body(server):
    server.script = [(401, {}, json.dumps({'error': {'message': f'Incorrect API key provided: {SECRET}',
                                                     'details': [SECRET]}}).encode(), 0)]
    transport, _ = make()
    with pytest.raises(LLMAuthError) as e:
        transport.post(server.url, {'authorization': f'Bearer {SECRET}'}, {})
    assert e.value.provider_body == {'error': {'message': 'Incorrect API key provided: ***', 'details': ['***']}}
    assert SECRET not in str(e.value)


def test_a_gzip_answer_is_decoded(server):
    import gzip
    server.script = [(200, {'content-encoding': 'gzip', 'content-type': 'application/json'},
                      gzip.compress(b'{"ok": "compressed"}'), 0)]
    transport, _ = make()
    assert transport.post(server.url, {}, {}) == {'ok': 'compressed'}
    assert 'gzip' in {k.lower(): v for k, v in server.received[0][1].items()}['accept-encoding']


def test_a_redirect_is_an_error_that_says_where_it_points_not_a_silent_get(server):
    server.script = [(307, {'location': 'https://api.example.com/v2/x'}, b'', 0)]
    transport, sleeps = make()
    with pytest.raises(LLMError, match='HTTP 307.*api.example.com/v2/x.*"address"') as e:
        transport.post(server.url, {}, {})
    assert e.value.status == 307 and len(server.received) == 1 and sleeps == []


def test_an_answer_cut_off_midway_is_an_error_and_the_next_call_gets_a_fresh_connection(server):
    from scripted_server import Cut
    server.script = [(200, {'content-type': 'application/json'}, Cut(b'{"ok": "' + b'x' * 5000 + b'"}'), 0),
                     (200, {}, b'{"ok": true}', 0)]
    transport, _ = make(max_retries=0)
    with pytest.raises(LLMError, match='broke before it was complete'):
        transport.post(server.url, {}, {})
    assert transport.post(server.url, {}, {}) == {'ok': True}


def test_connections_are_kept_alive_between_calls_and_carry_the_product_agent(server):
    server.script = [(200, {}, b'{"n": 1}', 0), (404, {}, b'{"error": {"message": "x"}}', 0), (200, {}, b'{"n": 2}', 0)]
    transport, _ = make(max_retries=1)
    assert transport.post(server.url, {'X-Mine': 'yes'}, {}) == {'n': 1}
    with pytest.raises(LLMError, match='HTTP 404'):
        transport.post(server.url, {'X-Mine': 'yes'}, {})                   # its body read: the connection stays
    assert transport.post(server.url, {'X-Mine': 'yes'}, {}) == {'n': 2}
    headers = [{k.lower(): v for k, v in h.items()} for _, h, _ in server.received]
    agents = {h.get('user-agent') for h in headers}
    assert len(agents) == 1 and agents.pop().startswith('llmconn/')
    assert all(h.get('x-mine') == 'yes' for h in headers)
    assert len(server.peers) == 1           # one kept-alive connection served all three


def test_fresh_headers_each_call_are_sent_as_given_and_nothing_piles_up(server):
    """The gateway builds a provider's headers per request: each call's own go out, and no cache grows."""
    import gc
    import weakref
    transport, _ = make()
    server.script = [(200, {}, b'{}', 0)] * 40

    class Headers(dict):        # a dict that can be watched for being freed
        pass

    first = Headers({'x-call': '0'})
    gone = weakref.ref(first)
    transport.post(server.url, first, {})
    del first
    for n in range(1, 40):
        transport.post(server.url + f'/p{n}', {'x-call': str(n)}, {})
    gc.collect()
    sent = [{k.lower(): v for k, v in h.items()}['x-call'] for _, h, _ in server.received]
    assert sent == [str(n) for n in range(40)]
    assert gone() is None                       # an old headers dict is not kept alive
    assert len(transport._targets) <= 32
