"""``timeout`` and ``stream_timeout`` bound calls, not socket reads (SPEC §14).

A provider trickling bytes never trips a read timeout; these tests hold
the transport to the whole-call bounds with a scripted server that sends
one byte (or one event) at a time, and check the chat lock is free after.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from llmconn.errors import LLMTimeout
from llmconn.transport import Transport

from scripted_server import Trickle

ANSWER = json.dumps({'id': 'c', 'object': 'chat.completion', 'choices': [
    {'index': 0, 'message': {'role': 'assistant', 'content': 'late'}, 'finish_reason': 'stop'}]}).encode()


def chunk(text: str) -> bytes:
    return b'data: ' + json.dumps({'choices': [{'index': 0, 'delta': {'content': text}}]}).encode() + b'\n\n'


FINISH = (b'data: ' + json.dumps({'choices': [{'index': 0, 'delta': {}, 'finish_reason': 'stop'}]}).encode()
          + b'\n\ndata: [DONE]\n\n')


def test_a_trickling_provider_cannot_hold_a_chat_and_its_lock_past_timeout(server, open_registry, redis_url,
                                                                            unique):
    server.script = [(200, {'content-type': 'application/json'}, Trickle(ANSWER, 1.5)),
                     (200, {'content-type': 'application/json'}, ANSWER)]
    registry = open_registry({'redis': {'url': redis_url}, 'llm': [
        {'name': 'slow', 'provider': 'openai', 'model': 'gpt-4.1', 'address': server.url, 'timeout': 2,
         'max_retries': 0, 'lock_wait': 0}]})
    started = time.monotonic()
    with pytest.raises(LLMTimeout, match='"timeout" \\(2 s\\)'):
        registry['slow'].chat('hi', chat_id=unique)
    elapsed = time.monotonic() - started
    assert 1.9 <= elapsed < 3.4, elapsed          # 18 s before: every byte restarted the read timeout
    # The lock went with the call: lock_wait 0 would fail at once if it were still held.
    assert registry['slow'].chat('again', chat_id=unique)['text'] == 'late'
    assert registry['slow'].history(unique) == [{'role': 'user', 'content': 'again'},
                                                {'role': 'assistant', 'content': 'late'}]


def test_a_stream_stalling_inside_an_event_fails_after_timeout(server):
    server.script = [(200, {'content-type': 'text/event-stream'}, Trickle(chunk('a') + chunk('b') * 40, 0.02))]
    transport = Transport('t', pool_size=1, timeout=0.6, max_retries=0)
    started = time.monotonic()
    events = transport.post_stream(server.url + '/s', {}, {}).events
    with pytest.raises(LLMTimeout, match='stalled'):
        for _ in events:
            pass
    # Events arrive (each within 0.6 s) for a while; no single wait reaches the timeout ...
    assert time.monotonic() - started > 0.6


def test_a_stream_of_prompt_events_is_still_bounded_by_stream_timeout(server):
    server.script = [(200, {'content-type': 'text/event-stream'}, Trickle([chunk('x')] * 200, 0.05))]
    transport = Transport('t', pool_size=1, timeout=2, max_retries=0, stream_timeout=1)
    started = time.monotonic()
    seen = 0
    with pytest.raises(LLMTimeout, match='stream_timeout'):
        for _ in transport.post_stream(server.url + '/s', {}, {}).events:
            seen += 1
    assert seen > 3 and time.monotonic() - started < 2.5


def test_time_the_caller_spends_between_events_is_not_a_provider_stall(server):
    server.script = [(200, {'content-type': 'text/event-stream'}, [chunk('a'), chunk('b'), FINISH])]
    transport = Transport('t', pool_size=1, timeout=0.3, max_retries=0)
    seen = []
    for event in transport.post_stream(server.url + '/s', {}, {}).events:
        seen.append(event)
        time.sleep(0.5)         # the caller's own work, longer than the provider's timeout
    assert len(seen) == 4


def test_a_call_that_answers_in_time_leaves_no_deadline_behind(server):
    server.script = [(200, {}, ANSWER)]
    transport = Transport('t', pool_size=1, timeout=0.3, max_retries=0)
    assert transport.post(server.url + '/x', {}, {})['id'] == 'c'
    time.sleep(0.5)             # past the deadline: the pooled connection must still be usable
    server.script = [(200, {}, ANSWER)]
    assert transport.post(server.url + '/x', {}, {})['id'] == 'c'


GEVENT_SCRIPT = '''
from gevent import monkey; monkey.patch_all()
import sys, time, gevent
sys.path[:0] = {paths!r}
from scripted_server import ScriptedServer, Trickle
from llmconn.errors import LLMTimeout
from llmconn.transport import Transport
server = ScriptedServer().start()
server.script = [(200, {headers!r}, Trickle(b'{{"a": 1}}' * 5, 0.4, {framing!r}))]
ticks = []
ticker = gevent.spawn(lambda: [ticks.append(gevent.sleep(0.05)) for _ in range(100)])
started = time.monotonic()
try:
    Transport('g', pool_size=1, timeout=1, max_retries=0).post(server.url + '/x', {{}}, {{}})
except LLMTimeout:
    print('timeout', round(time.monotonic() - started, 1), len(ticks) > 10)
'''


@pytest.mark.parametrize('headers, framing', [({}, 'chunked'), ({'connection': 'close'}, 'chunked'),
                                             ({'connection': 'close'}, 'close')])
def test_timeout_holds_under_gevent_without_freezing_other_greenlets(headers, framing):
    here = Path(__file__).parent
    script = GEVENT_SCRIPT.format(paths=[str(here), str(here.parent)], headers=headers, framing=framing)
    out = subprocess.run([sys.executable, '-c', textwrap.dedent(script)], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split()[0] == 'timeout', out.stderr
    assert float(out.stdout.split()[1]) < 2 and out.stdout.split()[2] == 'True'


def test_trickled_response_headers_are_cut_off_at_timeout_too():
    import socket
    import threading

    listener = socket.create_server(('127.0.0.1', 0))
    stop = threading.Event()

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            for byte in b'HTTP/1.1 200 OK\r\nX-Slow: ' + b'x' * 100:
                if stop.is_set():
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(0.3)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    transport = Transport('t', pool_size=1, timeout=1, max_retries=0)
    started = time.monotonic()
    try:
        with pytest.raises(LLMTimeout):
            transport.post(f'http://127.0.0.1:{listener.getsockname()[1]}/x', {}, {})
        assert time.monotonic() - started < 2.5       # each byte within the read timeout, yet cut at 1 s
    finally:
        stop.set()
        listener.close()


def test_a_forked_worker_gets_its_own_watchdog(server):
    import os

    Transport('warm', pool_size=1, timeout=5, max_retries=0).post(server.url + '/x', {}, {})  # parent's watchdog runs
    server.script = [(200, {}, Trickle(ANSWER, 0.5))]
    pid = os.fork()
    if pid == 0:                                    # the child: exit 0 only if the deadline cut the call
        code = 1
        try:
            started = time.monotonic()
            Transport('child', pool_size=1, timeout=1, max_retries=0).post(server.url + '/x', {}, {})
        except LLMTimeout:
            code = 0 if time.monotonic() - started < 2.5 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# -- providers that close the connection after the answer (no keep-alive) ------------------------------

def test_connection_close_cannot_hold_a_chat_and_its_lock_past_timeout(server, open_registry, redis_url, unique):
    # http.client hands a "Connection: close" answer's socket to the response and forgets it on the
    # connection, so a deadline that looked for the socket there found nothing to cut.
    server.script = [(200, {'content-type': 'application/json', 'connection': 'close'}, Trickle(ANSWER, 1.5)),
                     (200, {'content-type': 'application/json'}, ANSWER)]
    registry = open_registry({'redis': {'url': redis_url}, 'llm': [
        {'name': 'slow', 'provider': 'openai', 'model': 'gpt-4.1', 'address': server.url, 'timeout': 2,
         'max_retries': 0, 'lock_wait': 0}]})
    started = time.monotonic()
    with pytest.raises(LLMTimeout, match='"timeout" \\(2 s\\)'):
        registry['slow'].chat('hi', chat_id=unique)
    assert 1.9 <= time.monotonic() - started < 3.4
    assert registry['slow'].chat('again', chat_id=unique)['text'] == 'late'     # lock_wait 0: it was free


@pytest.mark.parametrize('framing', ['close', 'length'])
def test_an_invoke_whose_body_has_no_chunks_is_cut_at_timeout(server, open_registry, framing):
    server.script = [(200, {'content-type': 'application/json', 'connection': 'close'},
                      Trickle(ANSWER, 0.7, framing=framing))]
    registry = open_registry({'llm': [{'name': 'slow', 'provider': 'openai', 'model': 'gpt-4.1',
                                       'address': server.url, 'timeout': 1, 'max_retries': 0}]})
    started = time.monotonic()
    with pytest.raises(LLMTimeout, match='"timeout" \\(1 s\\)'):
        registry['slow'].invoke('hi')
    assert time.monotonic() - started < 2.2


# -- event streams sent without chunked encoding ---------------------------------------------------------

@pytest.mark.parametrize('framing', ['close', 'length'])
def test_an_unchunked_event_stream_is_read_as_it_arrives(server, framing):
    deltas = [chunk(str(n)) for n in range(10)] + [FINISH]
    server.script = [(200, {'content-type': 'text/event-stream'}, Trickle(deltas, 0.1, framing=framing))]
    transport = Transport('t', pool_size=1, timeout=5, max_retries=0)
    started = time.monotonic()
    arrivals = [(event.data, time.monotonic() - started)
                for event in transport.post_stream(server.url + '/s', {}, {}).events]
    assert [json.loads(data)['choices'][0]['delta'].get('content') for data, _ in arrivals[:10]] == \
        [str(n) for n in range(10)]
    assert len(arrivals) == 12                      # ten deltas, the finish, [DONE]
    assert arrivals[0][1] < arrivals[9][1] - 0.5    # the first came long before the last, not with it


@pytest.mark.parametrize('framing', ['close', 'length'])
def test_an_unchunked_event_stream_that_stalls_is_cut_at_timeout(server, framing):
    slow = chunk('b') * 40          # each event of it takes 1.4 s to trickle in, byte by byte
    server.script = [(200, {'content-type': 'text/event-stream'},
                      Trickle([chunk('a')] + [slow[i:i + 1] for i in range(len(slow))], 0.02, framing=framing))]
    transport = Transport('t', pool_size=1, timeout=0.6, max_retries=0)
    seen = []
    with pytest.raises(LLMTimeout, match='stalled'):
        for event in transport.post_stream(server.url + '/s', {}, {}).events:
            seen.append(event.data)
    # The first event arrived before the stall; the half event cut off by the deadline is not handed on
    # (a body without chunks ends cleanly when the deadline shuts its socket).
    assert seen == [chunk('a')[6:-2].decode()]


def test_an_unchunked_event_stream_is_bounded_by_stream_timeout(server):
    server.script = [(200, {'content-type': 'text/event-stream'}, Trickle([chunk('x')] * 200, 0.05, 'close'))]
    transport = Transport('t', pool_size=1, timeout=2, max_retries=0, stream_timeout=1)
    started = time.monotonic()
    seen = 0
    with pytest.raises(LLMTimeout, match='stream_timeout'):
        for _ in transport.post_stream(server.url + '/s', {}, {}).events:
            seen += 1
    assert seen > 3 and time.monotonic() - started < 2.5
