"""redis.url: every form read offline, the same at load and in `llmconn check`, passwords masked whole."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llmconn import config as mod_config
from llmconn.errors import ConfigError
from llmconn.redact import mask_url
from llmconn.store import open_store
from llmconn.store.urls import CLUSTER, SENTINEL, SINGLE, parse_redis_url

HOSTILE = 'p/a#s?s@w:rd'        # a password holding every character that splits a URL


def test_cluster_url_lists_its_startup_nodes():
    target = parse_redis_url('rediss+cluster://u:pw@h1:7000,h2:7001,[::1]:7002?ssl_cert_reqs=none')
    assert (target.kind, target.tls, target.username, target.password) == (CLUSTER, True, 'u', 'pw')
    assert target.hosts == (('h1', 7000), ('h2', 7001), ('::1', 7002))
    assert target.options == {'ssl_cert_reqs': 'none'}


def test_sentinel_url_names_master_and_db():
    target = parse_redis_url('redis+sentinel://:pw@s1:26379,s2/mymaster/3')
    assert (target.kind, target.master, target.db) == (SENTINEL, 'mymaster', 3)
    assert target.hosts == (('s1', 26379), ('s2', 26379))


@pytest.mark.parametrize('url, complaint', [
    ('redis://h:notaport/0', 'port'),
    ('redis://h:70000/0', 'port'),
    ('redis+cluster://h1:1,h2:x', 'port'),
    ('redis+cluster://h1:1/2', 'database 0'),
    ('redis+sentinel://h1:1', 'master'),
    ('redis+sentinel://h1:1/m/x', 'database'),
    ('redis://h1:1,h2:2/0', 'one host'),
    ('redis://h/0?bogus=1', 'unknown option'),
    ('redis://h/0?socket_timeout=soon', 'float'),
    ('http://h', 'not supported'),
    ('redis+clutser://h', 'not supported'),
])
def test_bad_urls_are_refused_at_load_and_by_check(tmp_path, url, complaint):
    with pytest.raises(ConfigError, match=complaint):
        mod_config.load_dict({'redis': {'url': url}})
    with pytest.raises(ConfigError, match=complaint):
        open_store(url)
    config = tmp_path / 'llm.yaml'
    config.write_text(f'redis:\n  url: "{url}"\nllm: []\n')
    check = subprocess.run([sys.executable, '-m', 'llmconn', 'check', str(config)], capture_output=True, text=True)
    assert check.returncode != 0 and 'OK' not in check.stdout
    assert complaint in check.stderr + check.stdout


def test_a_password_with_url_delimiters_is_masked_whole():
    for url in (f'redis://user:{HOSTILE}@host:6379/0', f'redis+cluster://:{HOSTILE}@h1:1,h2:2',
                f'rediss+sentinel://u:{HOSTILE}@s1:1/m/0'):
        shown = mask_url(url)
        assert '***' in shown
        for piece in ('p/a', 's?s', 'w:rd', '#s'):
            assert piece not in shown, shown
        assert parse_redis_url(url).password == HOSTILE
        assert HOSTILE not in repr(parse_redis_url(url))


def test_a_hostile_password_never_shows_in_check_reprs_or_load_errors(tmp_path):
    url = f'redis://user:{HOSTILE}@host:6379/0'
    conf = mod_config.load_dict({'redis': {'url': url}})
    assert 'w:rd' not in repr(conf) and 'p/a' not in repr(conf.redis)
    with pytest.raises(ConfigError) as info:
        mod_config.load_dict({'redis': {'url': url + '?bogus=1'}})
    assert 'w:rd' not in str(info.value) and 'p/a' not in str(info.value)
    config = tmp_path / 'llm.yaml'
    config.write_text(f'redis:\n  url: "{url}"\nllm: []\n')
    check = subprocess.run([sys.executable, '-m', 'llmconn', 'check', str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert 'w:rd' not in check.stdout and 'p/a' not in check.stdout and 'user:***@host' in check.stdout


def test_a_sentinel_password_never_shows_in_check_reprs_errors_or_the_admin_page(tmp_path):
    from llmconn.errors import StoreError
    secret = 's3ntinel-secret'
    url = f'redis+sentinel://127.0.0.1:1/mymaster/0?sentinel_password={secret}'
    target = parse_redis_url(url)
    assert target.options['sentinel_password'] == secret
    for shown in (mask_url(url), repr(target), target.display):
        assert secret not in shown, shown
    assert 'sentinel_password=***' in target.display
    store = open_store(url)
    assert store.url_for_display == target.display          # what /admin and every error show
    with pytest.raises(StoreError) as info:        # nothing listens there: the error names the store
        store.ping()
    assert 'sentinel_password=***' in str(info.value) and secret not in str(info.value)
    store.close()
    config = tmp_path / 'llm.yaml'
    config.write_text(f'redis:\n  url: "{url}"\nllm: []\n')
    check = subprocess.run([sys.executable, '-m', 'llmconn', 'check', str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert secret not in check.stdout + check.stderr and 'sentinel_password=***' in check.stdout


def test_replicas_are_validated():
    assert mod_config.load_dict({'redis': {'url': 'redis://h/0', 'replicas': 1}}).redis.replicas == 1
    with pytest.raises(ConfigError, match='replicas'):
        mod_config.load_dict({'redis': {'url': 'redis://h/0', 'replicas': -1}})
    with pytest.raises(ConfigError, match='memory'):
        mod_config.load_dict({'redis': {'url': 'memory://', 'replicas': 1}})


def test_unix_socket_url():
    target = parse_redis_url('unix:///run/redis.sock?db=2')
    assert (target.kind, target.path, target.db) == (SINGLE, '/run/redis.sock', 2)


def test_url_options_reach_the_clients():
    for url in ('redis://127.0.0.1:1/0?socket_timeout=1.5&max_connections=7&health_check_interval=3',
                'redis+sentinel://127.0.0.1:1/m/0?socket_timeout=1.5&sentinel_password=x'):
        store = open_store(url)
        kwargs = store._runner.client.connection_pool.connection_kwargs
        assert kwargs['socket_timeout'] == 1.5
        store.close()
    store = open_store('redis://127.0.0.1:1/0?max_connections=7')
    assert store._runner.client.connection_pool.max_connections == 7
    store.close()


@pytest.mark.parametrize('url', ['redis+cluster://u:pw-s3cret@127.0.0.1:1,127.0.0.1:2',
                                 'redis+sentinel://u:pw-s3cret@127.0.0.1:1,127.0.0.1:2/mymaster/0'])
def test_opening_a_cluster_or_sentinel_store_does_not_connect_and_failing_is_a_store_error(url):
    import time

    from llmconn.errors import StoreError
    store = open_store(url)                      # nothing listens there: loading must not care
    started = time.monotonic()
    with pytest.raises(StoreError) as info:
        store.begin('conn', 'c', window=5, lock_ttl=5, lock_wait=5)
    assert time.monotonic() - started < 5
    assert 'pw-s3cret' not in str(info.value) and 'u:***@' in str(info.value)
    store.close()


def test_modes_are_enums_that_read_and_print_as_their_yaml_words():
    from llmconn.gateway_config import GatewayKey, Retention
    from llmconn.store.records import StoreMode
    from llmconn.store.urls import Deployment
    assert parse_redis_url('redis+sentinel://h:1/m').kind is Deployment.SENTINEL
    key = GatewayKey(id='k', secret='a-long-secret', tenant='t', models=('*',), retention='zero')
    assert key.retention is Retention.ZERO and f'{key.retention}' == 'zero'
    with pytest.raises(ValueError, match='standard'):
        GatewayKey(id='k', secret='a-long-secret', tenant='t', models=('*',), retention='forever')
    import json
    assert json.loads(json.dumps({'store_mode': StoreMode.GATEWAY})) == {'store_mode': 'gateway'}
    assert StoreMode('provider') is StoreMode.PROVIDER and str(StoreMode.NONE) == 'none'
