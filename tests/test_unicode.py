"""Text is valid Unicode everywhere (SPEC §14): split surrogate pairs joined, lone ones never stored.

A provider stream may cut an emoji's UTF-16 pair between two events
(``\\ud83d`` ends one delta, ``\\ude00`` starts the next). Stored as two lone
surrogates, that text made every later call on the chat raise
``UnicodeEncodeError``, and an SSE client of ``llmconn serve`` saw the
stream fail mid-way.
"""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path

import pytest
import requests

from llmconn.demo import start_server, stop
from llmconn.errors import InvalidInput
from llmconn.text import Joiner, clean
from llmconn.types import Turn

ROOT = Path(__file__).resolve().parent.parent
SMILE = '\U0001f600'


def claude_sse(*texts: str) -> bytes:
    """A Claude stream whose text deltas are ``texts``, JSON-escaped as the real API does (ASCII only)."""
    events = [{'type': 'message_start', 'message': {'id': 'msg_1', 'type': 'message', 'role': 'assistant',
                                                     'model': 'claude-sonnet-5-5', 'content': [],
                                                     'usage': {'input_tokens': 5, 'output_tokens': 1}}},
              {'type': 'content_block_start', 'index': 0, 'content_block': {'type': 'text', 'text': ''}}]
    events += [{'type': 'content_block_delta', 'index': 0, 'delta': {'type': 'text_delta', 'text': t}}
               for t in texts]
    events += [{'type': 'content_block_stop', 'index': 0},
               {'type': 'message_delta', 'delta': {'stop_reason': 'end_turn'}, 'usage': {'output_tokens': 4}},
               {'type': 'message_stop'}]
    return b''.join(f'event: {e["type"]}\ndata: {json.dumps(e)}\n\n'.encode() for e in events)


SPLIT = claude_sse('smile \ud83d', '\ude00 done')      # json.dumps escapes each half as \\udXXX
LONE = claude_sse('cut \ud83d')                         # the low half never comes
SSE_HEADERS = {'content-type': 'text/event-stream'}


@pytest.fixture
def claude(server, open_registry, redis_url):
    return open_registry({'redis': {'url': redis_url}, 'llm': [
        {'name': 'c', 'provider': 'claude', 'model': 'claude-sonnet-5-5', 'address': server.url,
         'max_retries': 0}]})['c']


def test_joiner_joins_a_pair_split_between_deltas_and_replaces_a_lone_half():
    joiner = Joiner()
    assert joiner.feed('a\ud83d') == 'a' and joiner.feed('\ude00b') == SMILE + 'b'
    assert joiner.feed('\ud83d') == '' and joiner.flush() == '\ufffd'
    assert clean('x\ude00\ud83d') == 'x\ufffd\ufffd' and clean('\ud83d\ude00') == SMILE


def test_a_pair_split_across_stream_events_is_stored_joined_and_the_chat_goes_on(server, claude, unique):
    server.script = [(200, SSE_HEADERS, SPLIT), (200, SSE_HEADERS, claude_sse('again'))]
    events = list(claude.stream('hi', chat_id=unique))
    deltas = [e.text for e in events if e.type == 'text']
    assert deltas == ['smile ', SMILE + ' done'] and events[-1].result['text'] == f'smile {SMILE} done'
    assert claude.history(unique)[1]['content'] == f'smile {SMILE} done'
    list(claude.stream('more', chat_id=unique))     # raised UnicodeEncodeError before
    sent = json.loads(server.received[1][2])
    assert sent['messages'][1]['content'] == f'smile {SMILE} done'


def test_a_lone_surrogate_from_the_provider_becomes_u_fffd_everywhere(server, claude, unique):
    server.script = [(200, SSE_HEADERS, LONE)]
    events = list(claude.stream('hi', chat_id=unique))
    assert ''.join(e.text for e in events if e.type == 'text') == 'cut \ufffd'
    assert events[-1].result['text'] == 'cut \ufffd'
    assert json.dumps(events[-1].result['raw'], ensure_ascii=False).encode('utf-8')
    assert claude.history(unique)[1]['content'] == 'cut \ufffd'


def test_a_non_streamed_answer_with_a_lone_surrogate_is_cleaned(server, claude, unique):
    body = {'id': 'm', 'type': 'message', 'role': 'assistant', 'model': 'claude-sonnet-5-5',
            'content': [{'type': 'text', 'text': 'half \udc00'}], 'stop_reason': 'end_turn',
            'usage': {'input_tokens': 1, 'output_tokens': 1}}
    server.script = [(200, {}, json.dumps(body).encode())]
    assert claude.chat('hi', chat_id=unique)['text'] == 'half \ufffd'


@pytest.mark.parametrize('call', ['invoke', 'chat', 'stream'])
def test_input_text_with_a_lone_surrogate_is_invalid_before_any_request(server, claude, call):
    with pytest.raises(InvalidInput, match='lone surrogate'):
        getattr(claude, call)('bad \ud83d text')
    with pytest.raises(InvalidInput, match='lone surrogate'):
        claude.invoke('fine', note='bad \udc00')
    assert server.received == []


def test_a_chat_already_holding_a_lone_surrogate_still_works(server, claude, unique):
    with claude.store.begin('c', unique, window=5, lock_ttl=5, lock_wait=1) as lock:
        lock.save(Turn(user='old', assistant='broken \ud83d'), expiry=60, max_turns=10)
    server.script = [(200, SSE_HEADERS, claude_sse('fine'))]
    assert list(claude.stream('next', chat_id=unique))[-1].result['text'] == 'fine'
    assert json.loads(server.received[0][2])['messages'][1]['content'] == 'broken \ufffd'
    assert claude.history(unique)[1]['content'] == 'broken \ufffd'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def test_serve_streams_a_split_pair_to_an_sse_client_as_one_character(server, tmp_path, redis_url):
    (tmp_path / 'llm.yaml').write_text(f'''
redis: {{url: "{redis_url}"}}
skills_dir: {ROOT / 'etc' / 'skills'}
llm:
  - {{name: Support, provider: claude, model: claude-sonnet-5-5, address: "{server.url}", max_retries: 0}}
''')
    services = tmp_path / 'services'
    services.mkdir()
    shutil.copy(ROOT / 'services' / 'demo_llm.py', services / 'demo_llm.py')
    server.script = [(200, SSE_HEADERS, SPLIT), (200, SSE_HEADERS, claude_sse('two'))]
    port = free_port()
    proc = start_server(tmp_path / 'llm.yaml', services, port)
    try:
        url = f'http://127.0.0.1:{port}/demo.llm.support-chat-stream'
        user = f'u{time.monotonic_ns()}'
        first = requests.post(url, json={'user_id': user, 'text': 'hi'}, timeout=20)
        assert first.status_code == 200 and 'event: error' not in first.text, first.text
        assert SMILE in first.content.decode('utf-8')
        second = requests.post(url, json={'user_id': user, 'text': 'again'}, timeout=20)
        assert 'event: error' not in second.text and 'two' in second.text
    finally:
        stop(proc)
