"""The log of ``llmconn serve``: JSON lines that parse, access lines with tokens, no secret, no text.

The server is run with distinctive strings as its API key, the connection's
secret and the users' messages; every line it writes is parsed as JSON and
searched for them.
"""

import io
import json
import logging
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from llmconn import logs, observe
from llmconn.demo import start_server, stop
from test_metrics import free_port, write_setup

ROOT = Path(__file__).resolve().parent.parent
API_KEY = 'log-test-api-key-Zq81xK'
SECRET = 'sk-log-test-secret-Vb27'
TEXTS = [f'distinctive-user-text-{i}-{uuid.uuid4().hex[:6]}' for i in range(5)]

BOOM = f'''
from llmconn.service import Service


class Boom(Service):
    name = 'test.boom'

    def handle(self):
        raise RuntimeError('a careless service put ' + {API_KEY!r} + ' and ' + {SECRET!r} + ' in its error')
'''


def run_server(tmp_path, provider, redis_url, fmt):
    config, services = write_setup(tmp_path, provider.url, redis_url, api_keys=[API_KEY])
    config.write_text(config.read_text().replace('sk-metrics-test', SECRET))
    (services / 'boom.py').write_text(BOOM)
    port = free_port()
    log_path = tmp_path / 'server.log'
    log = log_path.open('w')
    proc = start_server(config, services, port, extra=['--log-format', fmt], stderr=log,
                        env=None)
    return proc, f'http://127.0.0.1:{port}', log_path, log


def call(url, service, payload, key=API_KEY):
    return requests.post(f'{url}/{service}', json=payload, headers={'X-API-Key': key}, timeout=10)


def test_json_log_lines_parse_carry_the_access_fields_and_never_a_secret_or_text(tmp_path, provider, redis_url):
    proc, url, log_path, log = run_server(tmp_path, provider, redis_url, 'json')
    try:
        chat = call(url, 'demo.llm.support-chat', {'user_id': 'ann', 'text': TEXTS[0]})
        ask = call(url, 'demo.llm.ask', {'text': TEXTS[1]})
        with requests.post(f'{url}/demo.llm.support-chat-stream', json={'user_id': 'ann', 'text': TEXTS[2]},
                           headers={'X-API-Key': API_KEY}, stream=True, timeout=10) as stream:
            done = [json.loads(line[6:]) for line in stream.iter_lines() if line.startswith(b'data: {"text": "echo')]
        provider.fail(400, count=1)
        refused = call(url, 'demo.llm.ask', {'text': TEXTS[3]})
        # A provider whose error quotes the request: the caller gets its words, the log does not.
        provider.fail(400, count=1, body={'error': {'type': 'invalid_request_error',
                                                    'message': f'your message {TEXTS[4]!r} is refused'}})
        quoting = call(url, 'demo.llm.ask', {'text': TEXTS[4]})
        boom = call(url, 'test.boom', {})
        unauthorized = call(url, 'demo.llm.ask', {'text': 'x'}, key='not-the-key-Jh3')
    finally:
        stop(proc)
        log.close()
    assert [r.status_code for r in (chat, ask, refused, quoting, boom, unauthorized)] == [200, 200, 502, 502, 500, 401]
    assert TEXTS[4] in quoting.json()['error']
    raw = log_path.read_text()
    lines = [json.loads(line) for line in raw.splitlines() if line.strip()]     # every line is one object
    for line in lines:                                                          # one schema for every line
        assert {'time', 'level', 'cid', 'service', 'connection', 'status', 'duration', 'tokens'} <= set(line), line
    for forbidden in [API_KEY, SECRET, 'not-the-key-Jh3', *TEXTS]:
        assert forbidden not in raw, forbidden
    access = {line['cid']: line for line in lines if 'tokens' in line}
    for response, usage in ((chat, chat.json()['usage']), (ask, ask.json()['usage']), (stream, done[-1]['usage'])):
        line = access[response.headers['X-Cid']]
        assert line['tokens'] == {'input': usage['input_tokens'], 'output': usage['output_tokens']}
        assert line['connection'] == 'Support' and line['status'] == 200 and line['level'] == 'INFO'
        assert 0 < line['duration'] < 10 and line['time'].endswith('Z')
    assert access[stream.headers['X-Cid']]['service'] == 'demo.llm.support-chat-stream'
    assert access[refused.headers['X-Cid']]['status'] == 502
    [failed] = [line for line in lines if line['level'] == 'ERROR' and line.get('cid') == quoting.headers['X-Cid']]
    assert 'HTTP 400' in failed['message'] and "the provider's message: in the caller's error" in failed['message']
    assert failed['service'] == 'demo.llm.ask' and failed['connection'] == 'Support'
    assert access[unauthorized.headers['X-Cid']]['status'] == 401
    # The service's traceback is logged under its request's cid, with the secrets it held masked.
    errors = [line for line in lines if line['level'] == 'ERROR' and line.get('cid') == boom.headers['X-Cid']]
    assert errors and 'RuntimeError' in errors[0]['exc'] and '*** and ***' in errors[0]['exc']


def test_text_access_line_carries_duration_and_tokens(tmp_path, provider, redis_url):
    proc, url, log_path, log = run_server(tmp_path, provider, redis_url, 'text')
    try:
        chat = call(url, 'demo.llm.support-chat', {'user_id': 'bob', 'text': TEXTS[0]})
    finally:
        stop(proc)
        log.close()
    usage = chat.json()['usage']
    cid = chat.headers['X-Cid']
    [line] = [line for line in log_path.read_text().splitlines() if f'cid={cid}' in line]
    assert 'POST /demo.llm.support-chat 200 ' in line and 'ms cid=' in line
    assert f'connection=Support tokens={usage["input_tokens"]}/{usage["output_tokens"]}' in line
    assert TEXTS[0] not in log_path.read_text()


def fake_registry(secret='first-secret', keys=()):
    conf = SimpleNamespace(llm=[SimpleNamespace(secret_value=secret)],
                           server=SimpleNamespace(api_keys=[SimpleNamespace(get_secret_value=lambda k=k: k)
                                                            for k in keys]),
                           redis=SimpleNamespace(url='redis://user:redis-pass-123@127.0.0.1:6379/0'))
    return SimpleNamespace(config=conf)


def formatted(formatter, message, *args, exc=None):
    record = logging.LogRecord('llmconn.test', logging.ERROR, __file__, 1, message, args, exc)
    return formatter.format(record)


def test_secrets_of_a_reloaded_configuration_are_masked_too():
    registry = fake_registry()
    secrets = logs.Secrets(registry)
    formatter = logs.JsonFormatter()
    formatter.scrub = secrets.scrub
    assert 'first-secret' not in formatted(formatter, 'saw %s', 'first-secret')
    assert 'redis-pass-123' not in formatted(formatter, 'url %s', 'redis://user:redis-pass-123@h')
    registry.config = fake_registry('second-secret', keys=['api-key-xyz']).config
    line = json.loads(formatted(formatter, 'saw %s and %s', 'second-secret', 'api-key-xyz'))
    assert line['message'] == 'saw *** and ***'


def test_json_formatter_masks_tracebacks_and_tags_lines_with_the_current_request():
    formatter = logs.JsonFormatter()
    formatter.scrub = logs.Secrets(fake_registry('tb-secret-9')).scrub
    try:
        raise ValueError('holds tb-secret-9')
    except ValueError:
        import sys
        exc = sys.exc_info()
    tally = observe.start_request('cid-42', 'POST', '/x')
    try:
        line = json.loads(formatted(formatter, 'failed', exc=exc))
    finally:
        observe.finish_request(tally)
    assert line['cid'] == 'cid-42' and 'ValueError: holds ***' in line['exc'] and 'tb-secret-9' not in str(line)
    assert observe.current() is None


def test_short_secrets_are_not_masked_so_lines_stay_readable():
    formatter = logs.TextFormatter(logs.TEXT_FORMAT)
    formatter.scrub = logs.Secrets(fake_registry('abc')).scrub
    assert 'abcdef' in formatted(formatter, 'abcdef')


def test_unknown_log_format_is_refused():
    with pytest.raises(ValueError, match='text, json'):
        logs.configure('xml', stream=io.StringIO())


def test_uncaught_errors_of_greenlets_and_threads_become_log_lines(monkeypatch):
    import threading

    import gevent
    hub = gevent.get_hub()
    monkeypatch.setattr(threading, 'excepthook', threading.excepthook)
    monkeypatch.setattr(hub, 'print_exception', hub.print_exception)
    root = logging.getLogger()
    monkeypatch.setattr(root, 'handlers', list(root.handlers))
    monkeypatch.setattr(root, 'level', root.level)
    out = io.StringIO()
    logs.configure('json', stream=out)

    def fail(what):
        raise RuntimeError(f'{what} fell over')

    gevent.spawn(fail, 'greenlet').join()
    thread = threading.Thread(target=fail, args=('thread',))
    thread.start()
    thread.join()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line['level'] for line in lines] == ['ERROR', 'ERROR']
    assert 'greenlet fell over' in lines[0]['exc'] and 'thread fell over' in lines[1]['exc']
