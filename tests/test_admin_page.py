"""``GET /admin``: refused without a configured key, escaped everywhere, and working in a real browser."""

from __future__ import annotations

import io
import os
import shutil
import socket
import textwrap
from base64 import b64encode
from types import SimpleNamespace

import pytest

from llmconn import Registry
from llmconn.demo import start_server, stop
from llmconn.wsgi import App

API_KEY = 'admin-page-key-123'
SECRET = 'sk-admin-page-secret'
HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"> & "quotes"'
HOSTILE_ID = '<b>id</b>"\'&'


def _config(tmp_path, redis_url, provider, name, keys=(API_KEY,)):
    listed = ''.join(f'\n    - {k}' for k in keys) or ' []'
    path = tmp_path / 'llm.yaml'
    path.write_text(textwrap.dedent(f'''
        redis:
          url: {redis_url}
        server:
          api_keys:''') + listed + textwrap.dedent(f'''
        llm:
          - name: {name}
            model: claude-sonnet-5-5
            address: {provider.url}
            secret: {SECRET}
          - name: {name}-<i>two</i>
            model: claude-sonnet-5-5
            address: {provider.url}
            secret: {SECRET}
    '''))
    return path


def _get(app, path='/admin', query='', headers=None, method='GET'):
    environ = {'REQUEST_METHOD': method, 'PATH_INFO': path, 'QUERY_STRING': query, 'wsgi.input': io.BytesIO()}
    environ.update(headers or {})
    seen = {}

    def start_response(status, headers):
        seen['status'], seen['headers'] = int(status.split()[0]), dict(headers)

    body = b''.join(app(environ, start_response))
    return seen['status'], seen['headers'], body.decode()


@pytest.fixture
def app_for(tmp_path, redis_url, provider, unique):
    opened = []

    def make(keys=(API_KEY,)):
        registry = Registry.from_file(_config(tmp_path, redis_url, provider, unique, keys))
        opened.append(registry)
        return App(SimpleNamespace(registry=registry, deployer=SimpleNamespace(services={}))), registry

    yield make
    for registry in opened:
        registry.close()


def _basic(password):
    return {'HTTP_AUTHORIZATION': 'Basic ' + b64encode(f'anyone:{password}'.encode()).decode()}


def test_the_admin_page_is_refused_entirely_when_no_api_key_is_configured(app_for):
    app, _ = app_for(keys=())
    status, _, body = _get(app)
    assert status == 403 and 'api_keys' in body and 'LLMCONN_API_KEY' in body


def test_the_admin_page_asks_for_the_key_and_takes_it_three_ways(app_for):
    app, _ = app_for()
    status, headers, _ = _get(app)
    assert status == 401 and headers['WWW-Authenticate'].startswith('Basic ')
    assert _get(app, headers=_basic('wrong'))[0] == 401
    assert _get(app, headers={'HTTP_X_API_KEY': 'wrong'})[0] == 401
    for headers in (_basic(API_KEY), {'HTTP_X_API_KEY': API_KEY}, {'HTTP_AUTHORIZATION': f'Bearer {API_KEY}'}):
        status, got, body = _get(app, headers=headers)
        assert status == 200 and got['Content-Type'].startswith('text/html'), body
        assert "default-src 'none'" in got['Content-Security-Policy']
    assert _get(app, method='POST', headers={'HTTP_X_API_KEY': API_KEY})[0] == 405


def test_chat_text_ids_and_names_are_escaped_everywhere(app_for, unique):
    app, registry = app_for()
    registry[unique].chat(HOSTILE, chat_id=HOSTILE_ID)
    registry[f'{unique}-<i>two</i>'].invoke('hello')
    registry.usage.flush()
    from urllib.parse import urlencode
    query = urlencode({'connection': unique, 'chat_id': HOSTILE_ID})
    status, _, body = _get(app, query=query, headers={'HTTP_X_API_KEY': API_KEY})
    assert status == 200
    assert '<script>' not in body and '<img' not in body and '<b>id</b>' not in body and '<i>two</i>' not in body
    assert '&lt;script&gt;window.__pwned = 1&lt;/script&gt;' in body and '&lt;i&gt;two&lt;/i&gt;' in body
    assert SECRET not in body


def test_bad_queries_get_a_message_not_a_crash(app_for, unique):
    app, _ = app_for()
    key = {'HTTP_X_API_KEY': API_KEY}
    assert _get(app, query='a=1&' * 50, headers=key)[0] == 400
    status, _, body = _get(app, query=f'connection={unique}&chat_id=' + 'x' * 300, headers=key)
    assert status == 200 and '1 to 256 characters' in body
    status, _, body = _get(app, query='connection=nope&chat_id=c1', headers=key)
    assert status == 200 and 'no LLM connection named' in body
    assert _get(app, headers={'HTTP_AUTHORIZATION': 'Basic ###'})[0] == 401
    assert _get(app, headers={'HTTP_AUTHORIZATION': 'Basic ' + 'é'})[0] == 401


def test_the_usage_table_has_a_key_column_when_gateway_keys_counted():
    from llmconn.admin_page import usage_table
    row = {'day': '2026-12-01', 'connection': 'C', 'model': 'm', 'key': '', 'calls': 1, 'errors': 0,
           'input_tokens': 2, 'output_tokens': 3, 'tool_calls': 0}
    assert '<th>Key</th>' not in usage_table([row])
    keyed = usage_table([row, dict(row, key='<team-a>'), dict(row, key='team-b')])
    assert '<th>Key</th>' in keyed and '<td>&lt;team-a&gt;</td>' in keyed and '<td>team-b</td>' in keyed
    assert keyed.count('<td></td>') == 1        # the row without a key: an empty cell, columns in line


def test_the_usage_table_shows_failovers_when_a_connection_had_any():
    from llmconn.admin_page import usage_table
    row = {'day': '2026-12-01', 'connection': 'C', 'model': 'm', 'key': '', 'calls': 4, 'errors': 1,
           'failovers': 0, 'input_tokens': 2, 'output_tokens': 3, 'tool_calls': 0}
    assert '<th>Failovers</th>' not in usage_table([row])
    table = usage_table([row, dict(row, connection='Primary', failovers=3)])
    assert '<th>Errors</th><th>Failovers</th><th>Input</th>' in table
    assert '<td>Primary</td><td>m</td><td class="n">4</td><td class="n">1</td><td class="n">3</td>' in table


def test_a_store_that_is_down_shows_its_error_in_the_page(tmp_path, provider, unique):
    from conftest import free_port
    registry = Registry.from_file(_config(tmp_path, f'redis://127.0.0.1:{free_port()}/0', provider, unique))
    try:
        status, _, body = _get(App(SimpleNamespace(registry=registry, deployer=SimpleNamespace(services={}))), headers={'HTTP_X_API_KEY': API_KEY})
    finally:
        registry.close()
    assert status == 200 and 'check that Redis is running' in body


def _browser():
    sync_api = pytest.importorskip('playwright.sync_api', reason='pip install playwright (the test extra)')
    exe = shutil.which('chromium') or shutil.which('chromium-browser')
    if not exe:
        message = 'no chromium on PATH: apt-get install -y chromium'
        if os.environ.get('LLMCONN_TEST_REQUIRE_BROWSER'):      # CI: a missing browser fails, never skips
            pytest.fail(message)
        pytest.skip(message)
    return sync_api, exe


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def test_the_admin_page_in_a_real_browser_charts_the_usage_and_shows_a_chats_turns(tmp_path, redis_url, provider,
                                                                                     unique):
    sync_api, exe = _browser()
    config = _config(tmp_path, redis_url, provider, unique)
    registry = Registry.from_file(config)
    replies = [registry[unique].chat(text, chat_id='ann') for text in ('My name is Ann', HOSTILE)]
    replies.append(registry[unique].invoke('one-shot'))
    registry.close()        # writes the invoke's count
    tokens = sum(r['usage']['input_tokens'] + r['usage']['output_tokens'] for r in replies)

    (tmp_path / 'services').mkdir()
    port = _free_port()
    server = start_server(config, tmp_path / 'services', port)
    dialogs = []
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=exe, args=['--no-sandbox'])
            context = browser.new_context(http_credentials={'username': 'admin', 'password': API_KEY})
            page = context.new_page()
            page.on('dialog', lambda d: (dialogs.append(d.message), d.dismiss()))
            response = page.goto(f'http://127.0.0.1:{port}/admin')
            assert response.status == 200
            assert page.inner_text('h1') == 'llmconn admin'

            bar = page.locator(f'#usage-chart rect.bar[data-connection="{unique}"]').last
            assert int(bar.get_attribute('data-tokens')) == tokens
            assert int(bar.get_attribute('data-calls')) == 3
            assert float(bar.get_attribute('height')) > 0
            assert bar.bounding_box()['height'] > 0        # drawn, not just present

            page.select_option('#history-form select[name=connection]', unique)
            page.fill('#history-form input[name=chat_id]', 'ann')
            page.click('#history-form button[type=submit]')
            page.wait_for_selector('#history')
            turns = page.locator('#history .turn').all_inner_texts()
            assert turns[0] == 'user: My name is Ann'
            assert turns[1].startswith('assistant: echo: My name is Ann')
            assert turns[2] == f'user: {HOSTILE}'      # shown as text, never run
            assert page.evaluate('window.__pwned') is None and not dialogs
            browser.close()
    finally:
        stop(server)
