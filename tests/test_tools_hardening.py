"""What tools cannot do to a chat: bad Unicode, oversize outputs, odd names, remote schemas.

A tool is not the caller: text a Python tool returns (or raises) is cleaned
to valid Unicode; text the caller gives as ``tool_outputs`` is checked like
the caller's own text, before any network call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import textwrap
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from llmconn import InvalidInput, Tool
from llmconn import items as mod_items
from llmconn.checks import MAX_TOOL_OUTPUT_CHARS, MAX_TOOL_OUTPUTS_CHARS
from llmconn.tools import run
from llmconn.types import Turn
from tests.tools_helpers import connection_config

ROOT = Path(__file__).resolve().parent.parent
LONE = 'half \ud83d here'


def lone_surrogate_tool(x: str) -> str:
    """Answers with half of a UTF-16 pair, as a badly decoded file would."""
    return LONE


def raising_tool(x: str) -> str:
    """Fails with a message holding a lone surrogate."""
    raise ValueError('bad \udc00 byte')


@pytest.fixture
def make(redis_url, provider, unique, open_registry):
    def make(kind='openai', **conn):
        return open_registry(connection_config(redis_url, provider.url, unique, kind, lock_wait=0, **conn))[unique]
    return make


def stored_values(redis_client, name: str) -> list[bytes]:
    """Every value stored under the connection's keys, raw."""
    found = []
    for key in redis_client.scan_iter(match=f'*{name}*'):
        kind = redis_client.type(key)
        if kind == b'list':
            found += redis_client.lrange(key, 0, -1)
        elif kind == b'string':
            found.append(redis_client.get(key))
        elif kind == b'hash':
            found += redis_client.hvals(key)
        elif kind == b'zset':
            found += redis_client.zrange(key, 0, -1)
    return found


# -- lone surrogates ------------------------------------------------------------------------------------

@pytest.mark.parametrize('tool', [lone_surrogate_tool, raising_tool])
def test_a_tools_lone_surrogate_is_cleaned_before_redis_the_provider_and_the_caller(make, provider, unique,
                                                                                   redis_client, tool):
    conn = make()
    reply = conn.chat(f'call {tool.__name__} {{"x": "1"}}', chat_id=unique, tools=[tool])
    output = reply['tool_calls'][0]['output']
    assert '\ufffd' in output and not any('\ud800' <= c <= '\udfff' for c in output)
    json.dumps(reply, ensure_ascii=False).encode('utf-8')               # no lone surrogate anywhere
    json.dumps(conn.history(unique), ensure_ascii=False).encode('utf-8')
    for value in stored_values(redis_client, unique):
        assert b'\\ud8' not in value.lower() and b'\\udc' not in value.lower()
        value.decode('utf-8')
    assert provider.violations == []


def test_run_cleans_what_a_tool_returns():
    assert run(Tool.from_callable(lone_surrogate_tool), 'lone_surrogate_tool', {'x': '1'}) == \
        ('half \ufffd here', False)


@pytest.mark.parametrize('value', [LONE, {'note': LONE}, [LONE]])
def test_tool_outputs_with_a_lone_surrogate_are_refused_before_any_request(make, provider, unique, value):
    conn = make()
    provider.clear()
    with pytest.raises(InvalidInput, match='lone surrogate'):
        conn.chat(chat_id=unique, tool_outputs={'call_1': value})
    assert provider.requests == []


def test_a_history_holding_a_lone_surrogate_in_a_tool_output_is_shown_cleaned(make, unique, tmp_path, redis_url,
                                                                               provider):
    conn = make()
    steps = (mod_items.call('c1', 'lookup', {'q': 'x'}), mod_items.output('c1', 'old \ud83d output'),
             mod_items.text('done'))
    with conn.store.begin(conn.name, unique, window=5, lock_ttl=5, lock_wait=1) as lock:     # an older version's turn
        lock.save(Turn(user='hi', assistant='done', items=steps, tag='x'), expiry=60, max_turns=10)
    assert conn.history(unique)[1]['tool_calls'][0]['output'] == 'old \ufffd output'
    config = tmp_path / 'llm.yaml'
    config.write_text(textwrap.dedent(f'''
        redis: {{url: "{redis_url}"}}
        llm:
          - {{name: "{conn.name}", provider: openai, model: gpt-4o-mini, address: "{provider.url}/v1"}}
    '''))
    done = subprocess.run([sys.executable, '-m', 'llmconn', 'history', conn.name, unique, '--json',
                           '--config', str(config)], capture_output=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.decode('utf-8'))[1]['tool_calls'][0]['output'] == 'old \ufffd output'


# -- sizes and names ------------------------------------------------------------------------------------

@pytest.mark.parametrize('outputs, limit', [
    ({'c1': 'x' * (MAX_TOOL_OUTPUT_CHARS + 1)}, 'limit of .* for one output'),
    ({'c1': {'rows': ['x' * (MAX_TOOL_OUTPUT_CHARS // 2)] * 3}}, 'limit of .* for one output'),
    ({f'c{i}': 'x' * MAX_TOOL_OUTPUT_CHARS for i in range(MAX_TOOL_OUTPUTS_CHARS // MAX_TOOL_OUTPUT_CHARS + 1)},
     'all outputs together, over the limit'),
])
def test_oversize_tool_outputs_are_refused_before_any_request(make, provider, unique, outputs, limit):
    conn = make()
    provider.clear()
    with pytest.raises(InvalidInput, match=limit):
        conn.chat(chat_id=unique, tool_outputs=outputs)
    assert provider.requests == []


@pytest.mark.parametrize('name', ['get_order\n', '\nget_order', 'get_order\r', 'get_order '])
def test_a_tool_name_with_a_trailing_newline_is_refused(make, provider, name):
    conn = make()
    with pytest.raises(InvalidInput, match='tool name'):
        conn.invoke('hi', tools=[Tool(name, '', {'type': 'object', 'properties': {}})])
    assert provider.requests == []


# -- remote $ref -----------------------------------------------------------------------------------------

class _SchemaHost(HTTPServer):
    """Serves a schema and counts who fetched it: a tool schema must never make llmconn fetch anything."""

    def __init__(self) -> None:
        self.fetched = 0

        class Handler(BaseHTTPRequestHandler):
            def do_GET(handler) -> None:
                self.fetched += 1
                body = b'{"type": "string"}'
                handler.send_response(200)
                handler.send_header('content-length', str(len(body)))
                handler.end_headers()
                handler.wfile.write(body)

            def log_message(handler, *args) -> None:
                pass

        super().__init__(('127.0.0.1', 0), Handler)
        threading.Thread(target=self.serve_forever, kwargs={'poll_interval': 0.01}, daemon=True).start()


@pytest.fixture
def schema_host():
    host = _SchemaHost()
    yield host
    host.shutdown()
    host.server_close()


@pytest.mark.parametrize('where', ['top', 'nested', 'relative', 'dynamic'])
def test_a_remote_ref_in_a_tool_schema_is_refused_and_never_fetched(make, provider, schema_host, where):
    url = f'http://127.0.0.1:{schema_host.server_address[1]}/s.json'
    ref = {'top': {'$ref': url}, 'nested': {'type': 'array', 'items': {'$ref': url}},
           'relative': {'$ref': 's.json'}, 'dynamic': {'$dynamicRef': url}}[where]
    tool = Tool('lookup', '', {'type': 'object', '$id': url.replace('s.json', 'root.json'),
                               'properties': {'q': ref}}, function=lambda q: 'x')
    conn = make()
    with pytest.raises(InvalidInput, match='\\$ref|\\$dynamicRef'):
        conn.invoke('call lookup {"q": "x"}', tools=[tool])
    assert provider.requests == [] and schema_host.fetched == 0


def test_local_refs_still_work(make, provider):
    tool = Tool('lookup', '', {'type': 'object', '$defs': {'q': {'type': 'string'}},
                               'properties': {'q': {'$ref': '#/$defs/q'}}}, function=lambda q: f'got {q}')
    reply = make().invoke('call lookup {"q": "x"}', tools=[tool])
    assert reply['tool_calls'][0]['output'] == 'got x' and not reply['tool_calls'][0]['is_error']


def test_validating_arguments_never_retrieves_a_remote_schema(schema_host):
    # Even a schema that slipped past the checks (a cached validator, a future path) resolves nothing remote.
    url = f'http://127.0.0.1:{schema_host.server_address[1]}/s.json'
    tool = Tool('lookup', '', {'type': 'object', 'properties': {'q': {'$ref': url}}}, function=lambda q: 'ran')
    output, is_error = run(tool, 'lookup', {'q': 'x'})
    assert is_error and 'ran' not in output and schema_host.fetched == 0


def test_a_service_payload_with_a_lone_surrogate_is_sent_as_valid_utf8_not_a_500():
    from types import SimpleNamespace

    from llmconn.responses import encode_response, sse
    for payload in ({'history': [{'content': LONE}]}, LONE):
        status, _, body = encode_response(SimpleNamespace(payload=payload, status_code=200, content_type='',
                                                          headers={}))
        assert status == 200 and 'half \ufffd here' in body[0].decode('utf-8')
    assert sse('text', {'text': LONE}).decode('utf-8').endswith('"half \ufffd here"}\n\n')
