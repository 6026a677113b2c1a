"""What a limited gateway request costs Redis, and the windows it counts in (SPEC §18).

The gateway runs in this process (its routes, a registry on a throwaway
redis-server, the fake provider), so every round trip to Redis is counted
where redis-py sends it: one ``send_packed_command`` is one round trip,
a pipeline included. The usage ledger's flusher is parked for the count.
"""

from __future__ import annotations

import datetime
import io
import json
import re
import threading
import time

import pytest
import redis
import redis.connection

from llmconn.gateway import limits, routes
from llmconn.registry import Registry
from llmconn.store.limits import _CALENDAR, limit_key

N = 6
KEYS = {
    'limited': ('sk-gw-trips-limited-secret', {'rpm': 1000, 'tpm': 10_000_000, 'budget_usd': 1000,
                                                'budget_period': 'month'}),
    'free': ('sk-gw-trips-free-secret', {}),
    'daily': ('sk-gw-trips-daily-secret', {'budget_usd': 1000}),
    'tight': ('sk-gw-trips-tight-secret', {'tpm': 1}),
    'busy': ('sk-gw-trips-busy-secret', {'rpm': 100_000_000, 'tpm': 10**12, 'budget_usd': 10**6}),
}


MINUTE_ROOM = 12       # seconds a test's requests may take: its counts stay within one minute of Redis's clock


def clear_of_the_minute_edge(redis_server) -> None:
    """Wait for the next minute when this one (by Redis's clock) ends within ``MINUTE_ROOM`` s.

    The rpm and tpm counters start again each minute: a test counting them across the edge would
    count the requests after it only.
    """
    seconds, micros = redis.Redis.from_url(redis_server.url).time()
    left = 60 - (seconds % 60 + micros / 1e6)
    if left < MINUTE_ROOM:
        time.sleep(left + 0.05)


@pytest.fixture
def gateway(redis_server, provider):
    clear_of_the_minute_edge(redis_server)
    registry = Registry.from_dict({
        'redis': {'url': redis_server.url},
        'gateway': {'keys': [{'id': f'key-{name}', 'secret': secret, 'tenant': 't', 'models': ['*'],
                              'limits': lim} for name, (secret, lim) in KEYS.items()]},
        'llm': [{'name': 'Chat', 'provider': 'openai', 'model': 'gpt-4.1', 'address': f'{provider.url}/v1',
                 'max_retries': 0, 'pricing': {'input': 2, 'output': 8}}],
    })
    registry.usage.flush_interval = 3600        # its flusher would add round trips of its own
    # Each request's round trips as if it were alone: none skips its PING for another's answer of a
    # moment ago (tested on its own below).
    routes.gateway_for(registry).ledger.fresh = 0.0
    yield registry
    registry.close()


class Trips:
    """Counts redis-py's round trips (one packed send each) while on."""

    def __init__(self, monkeypatch) -> None:
        self.sent: list[bytes] = []
        self.on = False
        original = redis.connection.AbstractConnection.send_packed_command

        def send(conn, command, check_health=True):
            if self.on:
                self.sent.append(b''.join(command) if isinstance(command, list) else command)
            return original(conn, command, check_health)
        monkeypatch.setattr(redis.connection.AbstractConnection, 'send_packed_command', send)

    def count(self, fn) -> int:
        self.sent.clear()
        self.on = True
        try:
            fn()
        finally:
            self.on = False
        return len(self.sent)


def request(registry, key: str, route: str, body: dict) -> tuple[int, dict, bytes]:
    raw = json.dumps(body).encode()
    environ = {'wsgi.input': io.BytesIO(raw), 'CONTENT_LENGTH': str(len(raw)), 'REQUEST_METHOD': 'POST',
               'HTTP_AUTHORIZATION': f'Bearer {KEYS[key][0]}'}
    status, headers, data = routes.handle(registry, environ, 'POST', f'/v1/{route}', 'cid-test')
    return status, dict(headers), b''.join(data)


def chat(registry, key: str, **kw) -> tuple[int, dict, bytes]:
    return request(registry, key, 'chat/completions',
                   {'model': 'Chat', 'messages': [{'role': 'user', 'content': 'hello there'}], **kw})


def respond(registry, key: str, **kw) -> tuple[int, dict, bytes]:
    return request(registry, key, 'responses', {'model': 'Chat', 'input': 'hello there', **kw})


def counters(redis_server, key_id: str) -> tuple[dict, dict]:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    counted = client.hgetall(limit_key(key_id))      # this minute's fields and this period's
    return counted, counted


def _park_limits_flusher(registry) -> limits.Limiter:
    lim = limits.limiter(registry.store)
    lim.interval = 3600         # what is kept waits for the next round trip of its key
    return lim


def kept_of(lim: limits.Limiter, key_id: str) -> tuple[int, int]:
    """The tokens and micro-USD the process keeps for ``key_id`` (0, 0 when none)."""
    kept = lim._pending.get(key_id)
    return (kept.tokens, kept.cost) if kept is not None else (0, 0)


def burst(ask, registry, key: str, calls: int):
    """``calls`` requests of ``key`` one after another through ``ask`` (chat or respond), each a 200."""
    def run() -> None:
        for _ in range(calls):
            status, headers, body = ask(registry, key)
            assert status == 200, body
    return run


def lone(fn):
    """``fn`` as a request of a key not busy in this process: its last one admitted a while ago."""
    time.sleep(limits.RESERVE_LIFETIME + 0.05)
    return fn()


@pytest.mark.parametrize('stream', [False, True])
def test_a_lone_chat_completion_with_limits_costs_one_round_trip_and_carries_the_last_ones_spend(
        gateway, monkeypatch, redis_server, stream):
    trips = Trips(monkeypatch)
    lim = _park_limits_flusher(gateway)
    extra = {'stream': True} if stream else {}
    for key in ('free', 'limited'):
        chat(gateway, key, **extra)                 # connections open, scripts loaded
    lim.flush()

    def calls(key):
        for _ in range(N):
            status, headers, body = lone(lambda: chat(gateway, key, **extra))
            assert status == 200, body
    assert trips.count(lambda: calls('free')) == 0
    assert trips.count(lambda: calls('limited')) == N
    assert all(b'EVALSHA' in sent for sent in trips.sent)
    # Each ADMIT carried the call before it: the last call's spend waits in the process.
    window, spend = counters(redis_server, 'key-limited')
    assert int(window['r']) == N + 1 and not lim._reserves
    tokens, cost = kept_of(lim, 'key-limited')
    assert tokens > 0 and cost > 0
    assert trips.count(lim.flush) == 1            # every key's kept spend: one pipeline
    window_after, spend_after = counters(redis_server, 'key-limited')
    assert int(window_after['t']) == int(window['t']) + tokens
    assert int(spend_after['s']) == int(spend['s']) + cost
    assert not lim._pending


@pytest.mark.parametrize('route', ['chat', 'responses'])
def test_a_busy_key_admits_from_a_reserve_and_hands_back_what_it_did_not_use(gateway, monkeypatch, redis_server,
                                                                             route):
    trips = Trips(monkeypatch)
    lim = _park_limits_flusher(gateway)
    monkeypatch.setattr(limits, 'RESERVE_LIFETIME', 30.0)     # a slow machine's burst: not past it
    ask = chat if route == 'chat' else respond
    ask(gateway, 'limited')
    lim.flush()
    calls = 3 * limits.RESERVE_MIN
    sent = trips.count(burst(ask, gateway, 'limited', calls))
    admits = [m for m in trips.sent if m.count(b'EVALSHA')]
    # One script per reserve, not one per request (a Response's rides its record's write).
    assert len(admits) <= calls // limits.RESERVE_MIN + 2, (len(admits), sent)
    window, _ = counters(redis_server, 'key-limited')
    held = lim._reserves['key-limited'].left if 'key-limited' in lim._reserves else 0
    assert int(window['r']) == 1 + calls + held              # the reserve counts as used while held
    lim.close()                                              # hands it back
    window, _ = counters(redis_server, 'key-limited')
    assert int(window['r']) == 1 + calls                     # exactly the requests served


def test_a_busy_key_s_reserve_doubles_while_it_is_used_up_and_halves_when_it_lapses(gateway, monkeypatch,
                                                                                       redis_server):
    trips = Trips(monkeypatch)
    lim = _park_limits_flusher(gateway)
    monkeypatch.setattr(limits, 'RESERVE_LIFETIME', 30.0)     # a slow machine's burst: not past it
    chat(gateway, 'busy')
    lim.flush()
    calls = 2 * limits.RESERVE_MAX
    trips.count(burst(chat, gateway, 'busy', calls))
    admits = [m for m in trips.sent if m.count(b'EVALSHA')]
    # 17, 33, 65, 129, 257, 257 requests a script: 6, where reserves of a fixed RESERVE_MIN take 31.
    assert len(admits) <= 7, len(admits)
    plan = lim.plan(next(k for k in gateway.config.gateway.keys if k.id == 'key-busy'))
    assert plan.want == limits.RESERVE_MAX
    lim._reserves['key-busy'].expires = 0                   # it lapses with most of it left
    assert chat(gateway, 'busy')[0] == 200
    assert plan.want == limits.RESERVE_MAX // 2
    lim.close()
    assert int(counters(redis_server, 'key-busy')[0]['r']) == 2 + calls      # exactly the requests served


@pytest.mark.parametrize('route', ['chat', 'responses'])
def test_concurrent_requests_of_a_busy_key_wait_for_one_ask_rather_than_each_send_their_own(gateway, monkeypatch,
                                                                                            redis_server, route):
    # Without it, every request that finds the reserve spent sends a script asking for one, and
    # each new reserve replaces (hands back) the one before: about one script per client per reserve.
    trips = Trips(monkeypatch)
    lim = _park_limits_flusher(gateway)
    monkeypatch.setattr(limits, 'RESERVE_LIFETIME', 30.0)
    ask = chat if route == 'chat' else respond
    ask(gateway, 'limited')
    lim.flush()
    clients, each = 8, 2 * limits.RESERVE_MIN
    failures: list = []

    def client():
        for _ in range(each):
            status, _, body = ask(gateway, 'limited')
            if status != 200:
                failures.append(body)

    def burst():
        threads = [threading.Thread(target=client) for _ in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    trips.count(burst)
    assert not failures, failures[:1]
    admits = [m for m in trips.sent if m.count(b'EVALSHA')]
    calls = clients * each
    assert len(admits) <= calls // limits.RESERVE_MIN + clients, len(admits)
    lim.close()
    window, _ = counters(redis_server, 'key-limited')
    assert int(window['r']) == 1 + calls                     # exactly the requests served


def test_a_reserve_expires_and_goes_back_to_its_minute(gateway, redis_server):
    lim = limits.limiter(gateway.store)
    lim.interval = 0.05
    for _ in range(3):
        assert chat(gateway, 'limited')[0] == 200
    assert lim._reserves['key-limited'].left > 0
    deadline = time.time() + 10
    while time.time() < deadline and (lim._reserves or lim._pending):
        time.sleep(0.05)
    assert not lim._reserves and not lim._pending, (lim._reserves, lim._pending)
    assert int(counters(redis_server, 'key-limited')[0]['r']) == 3


def test_a_reserve_is_never_taken_near_the_rpm(redis_server, provider):
    clear_of_the_minute_edge(redis_server)
    registry = Registry.from_dict({
        'redis': {'url': redis_server.url},
        'gateway': {'keys': [{'id': 'key-near', 'secret': KEYS['limited'][0], 'tenant': 't', 'models': ['*'],
                              'limits': {'rpm': 20}}]},
        'llm': [{'name': 'Chat', 'provider': 'openai', 'model': 'gpt-4.1', 'address': f'{provider.url}/v1',
                 'max_retries': 0}],
    })
    try:
        lim = _park_limits_flusher(registry)
        codes = [chat(registry, 'limited')[0] for _ in range(25)]
        # 20 - 1 - 16 x 1 >= 0: at most one reserve of one, then a script per request: exactly 20.
        assert codes == [200] * 20 + [429] * 5, codes
        lim.close()
        assert int(counters(redis_server, 'key-near')[0]['r']) == 20
    finally:
        registry.close()


def test_responses_with_limits_cost_no_round_trip_more_than_without(gateway, monkeypatch, redis_server):
    trips = Trips(monkeypatch)
    lim = _park_limits_flusher(gateway)
    for key in ('free', 'limited'):
        respond(gateway, key)
        respond(gateway, key, stream=True)
    lim.flush()

    def calls(key, **kw):
        for _ in range(N):
            status, headers, body = respond(gateway, key, **kw)
            assert status == 200, body
    for kw in ({}, {'stream': True}, {'store': False}):
        time.sleep(limits.RESERVE_LIFETIME + 0.05)      # no reserve: each admission rides its record
        free = trips.count(lambda: calls('free', **kw))
        assert free == 2 * N, kw                   # Redis reached (a stream's record in_progress), the ending
        assert trips.count(lambda: calls('limited', **kw)) == free, kw
    # Admitted in the first round trip, which carried the spend of the call before: only the last waits.
    window, spend = counters(redis_server, 'key-limited')
    held = lim._reserves['key-limited'].left if 'key-limited' in lim._reserves else 0     # counted while held
    assert int(window['r']) == 2 + 3 * N + held and int(window['t']) > 0 and int(spend['s']) > 0
    tokens, cost = kept_of(lim, 'key-limited')
    assert trips.count(lim.flush) == 1
    assert int(counters(redis_server, 'key-limited')[0]['t']) == int(window['t']) + tokens


def recorded(sent: bytes) -> str:
    """The status of the response record a round trip SET ('' for another command)."""
    found = re.search(rb'"status": ?"(\w+)"', sent) if sent.startswith(b'*5\r\n$3\r\nSET\r\n') else None
    return found.group(1).decode() if found else ''


def test_a_plain_response_asks_redis_to_answer_before_the_provider_and_writes_its_record_once(
        gateway, monkeypatch):
    # Nobody has a plain response's id before its ending, so an in_progress record would be read by
    # no one: a PING shows Redis answers (an outage costs no tokens), the record is written once.
    # A stream's client has its id from response.created on: its record is in_progress first.
    trips = Trips(monkeypatch)
    respond(gateway, 'free')
    assert trips.count(lambda: respond(gateway, 'free')) == 2
    ping, ending = trips.sent
    assert ping == b'*1\r\n$4\r\nPING\r\n' and recorded(ending) == 'completed'
    assert trips.count(lambda: respond(gateway, 'free', stream=True)) == 2
    assert [recorded(sent) for sent in trips.sent] == ['in_progress', 'completed']
    # A response that continues another read its record a moment ago: Redis answered, no PING.
    _, _, body = respond(gateway, 'free')
    previous = json.loads(body)['id']
    trips.count(lambda: respond(gateway, 'free', previous_response_id=previous))
    commands = [sent.split(b'\r\n')[2] for sent in trips.sent]
    assert b'GET' in commands and b'PING' not in commands and recorded(trips.sent[-1]) == 'completed'


def test_a_plain_response_right_after_another_sends_no_ping(gateway, monkeypatch):
    # Redis answered this process's records a moment ago: asking again would tell nothing new.
    ledger = routes.gateway_for(gateway).ledger
    ledger.fresh = 5.0          # ANSWERED_FRESH, long enough for a slow machine's next request
    trips = Trips(monkeypatch)
    respond(gateway, 'free')
    assert trips.count(lambda: respond(gateway, 'free')) == 1
    assert recorded(trips.sent[0]) == 'completed'
    ledger.fresh = 0.05
    time.sleep(0.06)
    assert trips.count(lambda: respond(gateway, 'free')) == 2            # a while later it asks again
    assert trips.sent[0] == b'*1\r\n$4\r\nPING\r\n'


def test_redis_lost_just_after_it_answered_costs_one_call_its_tokens_and_then_none(gateway, redis_server,
                                                                                   provider):
    ledger = routes.gateway_for(gateway).ledger
    ledger.fresh = 5.0
    respond(gateway, 'free')
    asked = len(provider.requests)
    redis_server.stop()
    try:
        status, _, body = respond(gateway, 'free')          # within the moment: no PING, the ending fails
        assert status == 503 and b'store' in body
        assert len(provider.requests) == asked + 1
        ledger.fresh = 0.05
        time.sleep(0.06)
        status, _, body = respond(gateway, 'free')
        assert status == 503 and b'store' in body
        assert len(provider.requests) == asked + 1          # asked first now: no tokens spent
    finally:
        redis_server.start()
    assert respond(gateway, 'free')[0] == 200


def test_a_plain_response_with_redis_down_is_a_503_before_the_provider(gateway, redis_server, provider):
    respond(gateway, 'free')
    asked = len(provider.requests)
    redis_server.stop()
    try:
        status, _, body = respond(gateway, 'free')
    finally:
        redis_server.start()
    assert status == 503 and b'store' in body
    assert len(provider.requests) == asked      # no tokens spent on a response that could not be recorded
    assert respond(gateway, 'free')[0] == 200


def test_a_response_that_reaches_the_budget_writes_its_spend_with_its_ending(gateway, monkeypatch, redis_server):
    trips = Trips(monkeypatch)
    lim = _park_limits_flusher(gateway)
    respond(gateway, 'daily')
    lim.flush()
    client = redis.Redis.from_url(redis_server.url)
    client.hset(limit_key('key-daily'), 's', 1000 * 1_000_000 - 1)      # a micro-USD short of the budget
    # The flush thread, woken at once near a limit, would race the ending for it (under gevent it runs
    # only once the request waits for Redis, by when the ending has taken it): parked here.
    monkeypatch.setattr(lim, '_wake_flusher', lambda: None)
    assert trips.count(lambda: respond(gateway, 'daily')) == 2           # no round trip of its own
    assert not lim._pending                                              # its ending carried it
    status, _, body = respond(gateway, 'daily')
    assert status == 429 and json.loads(body)['error']['code'] == 'insufficient_quota'


def test_a_responses_refusal_leaves_no_record(gateway, redis_server):
    client = redis.Redis.from_url(redis_server.url)
    minute = spend = limit_key('key-limited')
    client.hset(spend, mapping={'p': time.strftime('%Y%m', time.gmtime(client.time()[0])), 's': 10**9})
    before = set(client.scan_iter('llmconn:gw:resp:*'))
    status, headers, body = respond(gateway, 'limited')
    assert status == 429 and json.loads(body)['error']['code'] == 'insufficient_quota'
    assert set(client.scan_iter('llmconn:gw:resp:*')) == before


def test_an_admission_waits_for_the_flush_that_is_writing_its_keys_spend(gateway, monkeypatch):
    # The flush takes the kept spend off the list before its write lands: an admission of that key
    # in between would run its script without the spend, and let one request past the tpm.
    lim = _park_limits_flusher(gateway)
    monkeypatch.setattr(lim, '_wake_flusher', lambda: None)     # this test runs the flush itself
    assert chat(gateway, 'tight')[0] == 200
    assert kept_of(lim, 'key-tight')[0] > 1                  # past its tpm of 1, kept in the process
    write, writing = lim.redis.settle_many, threading.Event()

    def slow_write(calls):
        writing.set()
        time.sleep(0.3)
        return write(calls)
    monkeypatch.setattr(lim.redis, 'settle_many', slow_write)
    flush = threading.Thread(target=lim.flush)
    flush.start()
    try:
        assert writing.wait(5)
        status, headers, body = chat(gateway, 'tight')      # while the spend is on its way to Redis
    finally:
        flush.join(5)
    assert status == 429 and json.loads(body)['error']['type'] == 'tokens', body


def test_a_kept_spend_is_written_by_the_flusher_within_its_interval(gateway, redis_server):
    lim = limits.limiter(gateway.store)
    lim.interval = 0.1
    chat(gateway, 'limited')
    # The flusher takes the kept spend off the list before its write lands: wait for the counters.
    deadline = time.time() + 10
    while time.time() < deadline:
        window, spend = counters(redis_server, 'key-limited')
        if int(window.get('t', 0)) > 0 and int(spend.get('s', 0)) > 0:
            break
        time.sleep(0.02)
    assert not lim._pending
    assert int(window['t']) > 0 and int(spend['s']) > 0
    # The counters expire once their month (and a day) is over, whoever wrote them last.
    assert 31 * 86400 < redis.Redis.from_url(redis_server.url).ttl(limit_key('key-limited')) <= 32 * 86400


def test_a_busy_key_s_spend_rides_its_own_scripts_rather_than_a_flush(gateway, monkeypatch):
    # Its reserves end within the interval, and the script each next one takes carries what the key's
    # calls spent meanwhile: a flush of its own would be a round trip more for the same counts.
    lim = limits.limiter(gateway.store)
    lim.interval = 2 * limits.RESERVE_LIFETIME
    writes: list = []
    settle = lim.redis.settle_many
    monkeypatch.setattr(lim.redis, 'settle_many', lambda runs: (writes.append(len(runs)), settle(runs))[1])
    chat(gateway, 'busy')
    served, end = 0, time.monotonic() + 5 * limits.RESERVE_LIFETIME
    while time.monotonic() < end:
        assert chat(gateway, 'busy')[0] == 200
        served += 1
    assert not writes, (writes, served)
    deadline = time.monotonic() + 10
    while lim._pending and time.monotonic() < deadline:       # idle now: the flusher writes what is left
        time.sleep(0.02)
    assert writes and not lim._pending


def test_a_spend_that_cannot_be_written_is_kept_and_written_later(gateway, redis_server):
    lim = _park_limits_flusher(gateway)
    chat(gateway, 'limited')
    kept = kept_of(lim, 'key-limited')
    redis_server.stop()
    assert lim.flush() is False
    assert kept_of(lim, 'key-limited') == kept              # nothing lost
    status, _, body = lone(lambda: chat(gateway, 'limited'))
    assert status == 503 and b'store' in body               # never unlimited service
    assert kept_of(lim, 'key-limited') == kept              # the ADMIT that carried it failed: kept again
    redis_server.start()
    assert lim.flush() is True
    window, spend = counters(redis_server, 'key-limited')
    assert int(window['t']) == kept[0] and int(spend['s']) == kept[1]


def test_windows_are_redis_clock_not_the_process_clock(gateway, redis_server, monkeypatch):
    client = redis.Redis.from_url(redis_server.url)
    now = client.time()[0]
    minute = spend = limit_key('key-daily')
    # Counters of another minute and another day count as nothing, whatever this process's clock says.
    client.hset(minute, mapping={'m': now // 60 - 1, 'r': 999, 't': 999})
    client.hset(spend, mapping={'p': now // 86400 - 1, 's': 10**12})
    monkeypatch.setattr(time, 'time', lambda: now - 86400 * 3)         # a process three days behind
    status, headers, body = chat(gateway, 'daily')
    assert status == 200, body
    assert int(client.hget(minute, 'r')) == 1 and int(client.hget(minute, 'm')) == client.time()[0] // 60
    # A spend of today by Redis's clock refuses, with Retry-After to Redis's next UTC midnight.
    client.hset(spend, mapping={'p': now // 86400, 's': 10**12})
    status, headers, body = chat(gateway, 'daily')
    assert status == 429 and json.loads(body)['error']['code'] == 'insufficient_quota'
    left = 86400 - client.time()[0] % 86400
    assert left - 5 <= int(headers['Retry-After']) <= left + 5


def test_the_scripts_calendar_is_the_gregorian_one(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    days = list(range(0, 60000, 7)) + [19722, 19723, 19782, 20147, 20148, 11016, 11017, 11074]
    source = _CALENDAR + '''
local out = {}
for i, day in ipairs(ARGV) do
    local year, month = civil(tonumber(day))
    out[#out + 1] = year * 100 + month
    out[#out + 1] = first_day(year, month)
end
return out'''
    got = client.eval(source, 0, *days)
    for i, day in enumerate(days):
        date = datetime.date(1970, 1, 1) + datetime.timedelta(days=day)
        first = (date.replace(day=1) - datetime.date(1970, 1, 1)).days
        assert got[2 * i:2 * i + 2] == [date.year * 100 + date.month, first], date


@pytest.mark.parametrize('route', ['chat/completions', 'responses'])
def test_a_stream_the_client_left_counts_its_estimated_tokens_and_their_cost(gateway, route, redis_server):
    lim = _park_limits_flusher(gateway)
    chat(gateway, 'limited')
    lim.flush()
    window, spend = counters(redis_server, 'key-limited')
    body = ({'model': 'Chat', 'messages': [{'role': 'user', 'content': 'write a long story'}]} if route != 'responses'
            else {'model': 'Chat', 'input': 'write a long story'})
    status, headers, data = _open(gateway, 'limited', route, dict(body, stream=True))
    assert status == 200
    seen = b''
    for chunk in data:
        seen += chunk
        if seen.count(b'delta') >= 2:
            break
    data.close()                    # the client left
    assert b'[DONE]' not in seen and b'response.completed' not in seen
    lim.flush()                     # Chat's waits in the process; a Response's cancelled record carried it
    window_after, spend_after = counters(redis_server, 'key-limited')
    tokens, cost = int(window_after['t']) - int(window['t']), int(spend_after['s']) - int(spend['s'])
    assert tokens >= 1
    assert cost == tokens * 8       # output tokens only, at $8 per million: 8 micro-USD each


def _open(registry, key: str, route: str, body: dict):
    raw = json.dumps(body).encode()
    environ = {'wsgi.input': io.BytesIO(raw), 'CONTENT_LENGTH': str(len(raw)), 'REQUEST_METHOD': 'POST',
               'HTTP_AUTHORIZATION': f'Bearer {KEYS[key][0]}'}
    status, headers, data = routes.handle(registry, environ, 'POST', f'/v1/{route}', 'cid-test')
    return status, dict(headers), iter(data)


def test_closing_with_redis_down_logs_what_is_lost_and_returns(gateway, redis_server, caplog):
    lim = _park_limits_flusher(gateway)
    chat(gateway, 'limited')
    redis_server.stop()
    started = time.monotonic()
    lim.close()
    assert time.monotonic() - started < 30
    assert 'key-limited' in caplog.text and 'could not be counted' in caplog.text
    assert kept_of(lim, 'key-limited')[0] > 0


def test_a_call_that_failed_over_costs_its_budget_at_the_fallbacks_pricing(redis_server, provider):
    registry = Registry.from_dict({
        'redis': {'url': redis_server.url},
        'gateway': {'keys': [{'id': 'key-over', 'secret': KEYS['limited'][0], 'tenant': 't', 'models': ['*'],
                              'limits': {'budget_usd': 1000}}]},
        'llm': [{'name': 'Chat', 'provider': 'openai', 'model': 'gpt-4.1', 'address': f'{provider.url}/v1',
                 'max_retries': 0, 'pricing': {'input': 2, 'output': 8}, 'fallbacks': ['Dear']},
                {'name': 'Dear', 'provider': 'openai', 'model': 'gpt-4.1', 'address': f'{provider.url}/v1',
                 'max_retries': 0, 'pricing': {'input': 2000, 'output': 8000}}],
    })
    try:
        lim = _park_limits_flusher(registry)
        provider.fail(500)
        status, _, body = chat(registry, 'limited')
        assert status == 200, body
        usage = json.loads(body)['usage']
        tokens, cost = kept_of(lim, 'key-over')
        assert tokens == usage['prompt_tokens'] + usage['completion_tokens']
        assert cost == usage['prompt_tokens'] * 2000 + usage['completion_tokens'] * 8000
        assert lim.flush()
    finally:
        registry.close()


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
    from redis_topology import Cluster
    cluster = Cluster(tmp_path_factory.mktemp('limits-cluster'), replicas=0)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def test_limits_hold_on_a_redis_cluster_on_both_routes(cluster, provider):
    registry = Registry.from_dict({
        'redis': {'url': cluster.url},
        'gateway': {'keys': [{'id': 'key-cluster', 'secret': KEYS['limited'][0], 'tenant': 't', 'models': ['*'],
                              'limits': {'rpm': 5, 'tpm': 10_000_000, 'budget_usd': 1000}}]},
        'llm': [{'name': 'Chat', 'provider': 'openai', 'model': 'gpt-4.1', 'address': f'{provider.url}/v1',
                 'max_retries': 0, 'pricing': {'input': 2, 'output': 8}}],
    })
    try:
        statuses = [chat(registry, 'limited')[0], respond(registry, 'limited')[0],
                    respond(registry, 'limited', stream=True)[0], chat(registry, 'limited', stream=True)[0]]
        assert statuses == [200] * 4
        assert limits.limiter(registry.store).flush()
        client = redis.RedisCluster(host='127.0.0.1', port=cluster.masters()[0], decode_responses=True)
        minute = client.time()[0] // 60
        counted = client.hgetall(limit_key('key-cluster'))
        refused = [chat(registry, 'limited') for _ in range(3)]
        if int(counted['m']) == minute:        # the minute did not end between the calls
            assert int(counted['r']) == 4 and int(counted['t']) > 0 and int(counted['s']) > 0
            assert [status for status, _, _ in refused] == [200, 429, 429]
        client.close()
    finally:
        registry.close()


@pytest.mark.parametrize('stream', [False, True])
def test_a_chat_refused_by_its_rpm_never_reaches_the_provider(gateway, redis_server, provider, stream):
    chat(gateway, 'limited')
    client = redis.Redis.from_url(redis_server.url)
    client.hset(limit_key('key-limited'), mapping={'m': client.time()[0] // 60, 'r': 1000})
    before = len(provider.requests)
    status, headers, body = chat(gateway, 'limited', stream=stream)
    if status == 200:           # the minute ended just now: a new one admits again
        return
    assert status == 429 and json.loads(body)['error']['code'] == 'rate_limit_exceeded'
    assert headers['x-ratelimit-remaining-requests'] == '0'
    assert len(provider.requests) == before
