"""Configuration: defaults, secrets from the environment, and one clear error per mistake."""

from __future__ import annotations

import textwrap

import pytest

from llmconn import config as mod_config
from llmconn.errors import ConfigError


def load(conns, environ=None, **top):
    return mod_config.load_dict({'llm': conns, **top}, source='test.yaml', environ=environ or {})


def test_defaults_mirror_zato():
    conf = load([{'name': 'c', 'model': 'claude-sonnet-5-5'}])
    c = conf.llm[0]
    assert (c.provider, c.address, c.is_active) == ('claude', 'https://api.anthropic.com', True)
    assert (c.pool_size, c.timeout, c.max_tokens, c.max_history_turns, c.chat_expiry) == (50, 60, 1024, 20, 86400)
    assert (c.max_retries, c.lock_wait, c.lock_ttl, c.max_stored_turns, c.state) == (2, 10, 30, 1000, 'local')
    assert conf.redis.url == 'memory://'


@pytest.mark.parametrize('model, provider, address', [
    ('claude-haiku-5-5', 'claude', 'https://api.anthropic.com'),
    ('gemini-2.5-flash', 'gemini', 'https://generativelanguage.googleapis.com/v1beta'),
    ('gpt-4o-mini', 'openai', 'https://api.openai.com/v1'),
    ('llama3.1:8b', 'openai', 'https://api.openai.com/v1'),
])
def test_provider_inferred_from_model_name(model, provider, address):
    c = load([{'name': 'c', 'model': model}]).llm[0]
    assert (c.provider, c.address) == (provider, address)


def test_explicit_provider_and_address_win():
    c = load([{'name': 'c', 'model': 'claude-x', 'provider': 'openai', 'address': 'http://localhost:11434/v1/'}]).llm[0]
    assert (c.provider, c.address) == ('openai', 'http://localhost:11434/v1')


def test_secret_from_env_with_default_and_zato_syntax():
    env = {'KEY_A': 'sk-aaa', 'KEY_C': 'sk-ccc'}
    conf = load([{'name': 'a', 'model': 'm', 'secret': '${KEY_A}'},
                 {'name': 'b', 'model': 'm', 'api_key': '${KEY_B:-fallback}'},
                 {'name': 'c', 'model': 'm', 'password': 'Zato_Enmasse_Env.KEY_C'}], environ=env)
    assert [c.secret_value for c in conf.llm] == ['sk-aaa', 'fallback', 'sk-ccc']
    assert 'sk-aaa' not in repr(conf) and 'sk-aaa' not in str(conf.llm[0])


def test_missing_env_variable_names_variable_and_connection():
    with pytest.raises(ConfigError) as e:
        load([{'name': 'My Claude', 'model': 'claude-x', 'secret': '${NOT_SET_ANYWHERE}'}])
    assert 'NOT_SET_ANYWHERE' in str(e.value) and 'My Claude' in str(e.value) and 'test.yaml' in str(e.value)


@pytest.mark.parametrize('conn, words', [
    ({'name': 'c', 'model': 'm', 'timout': 5}, ['"timout"', 'unknown key', 'connection "c"']),
    ({'name': 'c', 'model': 'm', 'timeout': 'soon'}, ['"timeout"', 'connection "c"']),
    ({'name': 'c'}, ['"model"', 'required']),
    ({'model': 'm'}, ['llm[0]', '"name"']),
    ({'name': 'c', 'model': 'm', 'provider': 'cohere'}, ['cohere', 'claude, gemini, openai, openai-responses']),
    ({'name': 'c', 'model': 'm', 'secret': 'a', 'api_key': 'b'}, ['secret', 'api_key']),
    ({'name': 'c', 'model': 'm', 'address': 'api.example.com'}, ['"address"', 'http://']),
    ({'name': 'c', 'model': 'gpt-4o', 'max_tokens': 4096, 'thinking': {'type': 'enabled', 'budget_tokens': 2048}},
     ['thinking', 'does not support']),
    ({'name': 'c', 'model': 'claude-x', 'thinking': {'type': 'enabled', 'budget_tokens': 100}}, ['1024']),
    ({'name': 'c', 'model': 'claude-x', 'max_tokens': 2000, 'thinking': {'type': 'enabled', 'budget_tokens': 4096}},
     ['below max_tokens']),
    ({'name': 'c', 'model': 'gpt-4o', 'state': 'provider'}, ['"state"', 'stateless']),
    ({'name': 'c', 'model': 'm', 'max_history_turns': 0}, ['max_history_turns']),
])
def test_bad_connection_is_one_clear_error(conn, words):
    with pytest.raises(ConfigError) as e:
        load([conn])
    message = str(e.value)
    assert message.startswith('test.yaml: ')
    for word in words:
        assert word in message, message


def test_duplicate_names_and_unknown_top_level_keys():
    with pytest.raises(ConfigError, match='used twice'):
        load([{'name': 'c', 'model': 'm'}, {'name': 'c', 'model': 'n'}])
    with pytest.raises(ConfigError, match='unknown top-level key.*llms'):
        mod_config.load_dict({'llms': []}, source='x.yaml')


def test_secret_never_in_error_messages():
    with pytest.raises(ConfigError) as e:
        load([{'name': 'c', 'model': 'm', 'secret': 'sk-very-secret', 'timeout': 'x'}])
    assert 'sk-very-secret' not in str(e.value)


def test_load_file_resolves_skills_dir_and_names_the_file(tmp_path):
    path = tmp_path / 'llm.yaml'
    path.write_text(textwrap.dedent('''
        redis:
          url: ${REDIS_URL_FOR_TEST:-memory://}
        skills_dir: my-skills
        llm:
          - name: Local
            model: llama3
            address: http://127.0.0.1:11434/v1
    '''))
    conf = mod_config.load_file(path)
    assert conf.skills_path == (tmp_path / 'my-skills').resolve()
    assert conf.redis.url == 'memory://' and conf.llm[0].secret is None
    path.write_text('llm:\n  - name: x\n    model: [unclosed\n')
    with pytest.raises(ConfigError, match=str(path)):
        mod_config.load_file(path)
    with pytest.raises(ConfigError, match='cannot read'):
        mod_config.load_file(tmp_path / 'missing.yaml')


def test_durations_take_fractions_of_a_second():
    c = load([{'name': 'c', 'model': 'm', 'chat_expiry': 1.5, 'lock_wait': 0.25, 'lock_ttl': 2.5, 'timeout': 0.5}]).llm[0]
    assert (c.chat_expiry, c.lock_wait, c.lock_ttl, c.timeout) == (1.5, 0.25, 2.5, 0.5)


def test_redis_password_is_masked_in_the_config_repr():
    conf = mod_config.load_dict({'redis': {'url': 'redis://app:pw-TOP-SECRET@10.0.0.5:6379/0'}}, source='x.yaml')
    assert conf.redis.url == 'redis://app:pw-TOP-SECRET@10.0.0.5:6379/0'      # usable ...
    assert 'pw-TOP-SECRET' not in repr(conf) and 'pw-TOP-SECRET' not in str(conf.redis)   # ... never shown
    assert 'redis://app:***@10.0.0.5:6379/0' in repr(conf.redis)


# ---- hardening (SPEC §14)


def test_a_lock_ttl_renewal_cannot_keep_alive_is_refused_at_load_saying_why():
    with pytest.raises(ConfigError, match=r'lock_ttl must be at least 0\.1 s, got 0\.003: .*renewed every'):
        load([{'name': 'c', 'model': 'm', 'lock_ttl': 0.003}])
    with pytest.raises(ConfigError, match='lock_ttl must be at least'):
        load([{'name': 'c', 'model': 'm', 'lock_ttl': float('nan')}])
    assert load([{'name': 'c', 'model': 'm', 'lock_ttl': 0.1}]).llm[0].lock_ttl == 0.1


BILLION_LAUGHS = '\n'.join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f'{n}: &{n} [{",".join([f"*{p}"] * 9)}]' for p, n in zip('abcdefg', 'bcdefgh')]
    + ['llm: [*h]']) + '\n'


def test_a_billion_laughs_file_fails_fast_in_check_and_on_reload(tmp_path):
    import subprocess
    import sys

    from llmconn.registry import Registry

    path = tmp_path / 'llm.yaml'
    path.write_text(BILLION_LAUGHS)
    with pytest.raises(ConfigError, match='aliases .* not allowed'):
        mod_config.load_file(path)
    out = subprocess.run([sys.executable, '-m', 'llmconn', 'check', str(path)], capture_output=True,
                         text=True, timeout=30)      # 55 s and 1.2 GB before
    assert out.returncode != 0 and 'aliases' in out.stderr + out.stdout
    path.write_text('llm:\n  - {name: c, model: gpt-4o}\n')
    registry = Registry.from_file(path)
    try:
        path.write_text(BILLION_LAUGHS)
        with pytest.raises(ConfigError, match='aliases'):
            registry.reload()
        assert list(registry) == ['c']          # the old set keeps serving
    finally:
        registry.close()


def test_merge_keys_are_aliases_too_and_refused(tmp_path):
    path = tmp_path / 'llm.yaml'
    path.write_text('base: &base {model: gpt-4o}\nllm:\n  - <<: *base\n    name: c\n')
    with pytest.raises(ConfigError, match='line 3: YAML aliases'):
        mod_config.load_file(path)


def test_a_yaml_syntax_error_says_where_without_quoting_the_secret_on_that_line(tmp_path):
    path = tmp_path / 'llm.yaml'
    path.write_text('llm:\n  - {name: a, model: gpt-4o, secret: sk-live-TOPSECRET: x}\n')
    with pytest.raises(ConfigError) as info:
        mod_config.load_file(path)
    assert 'line 2' in str(info.value) and 'TOPSECRET' not in str(info.value)


@pytest.mark.parametrize('address', ['https://user:sk-PROXYKEY@proxy.example/v1', 'https://sk-PROXYKEY@proxy/v1',
                                     'https://u:sk-PROXYKEY/with#odd?chars@proxy/v1'])
def test_address_userinfo_is_masked_in_check_repr_and_errors(tmp_path, address):
    import subprocess
    import sys

    path = tmp_path / 'llm.yaml'
    path.write_text(f'llm:\n  - {{name: a, model: gpt-4o, address: "{address}"}}\n')
    out = subprocess.run([sys.executable, '-m', 'llmconn', 'check', str(path)], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0 and 'proxy' in out.stdout and 'PROXYKEY' not in out.stdout + out.stderr
    assert 'PROXYKEY' not in repr(mod_config.load_file(path))
    with pytest.raises(ConfigError) as info:
        load([{'name': 'a', 'model': 'gpt-4o', 'address': address.replace('https', 'ftp')}])
    assert 'PROXYKEY' not in str(info.value) and 'must start with http' in str(info.value)


@pytest.mark.parametrize('value', [float('nan'), float('inf'), [1, float('-inf')]])
def test_params_holding_nan_or_infinity_are_refused_at_load(value):
    with pytest.raises(ConfigError, match='NaN and Infinity are not JSON'):
        load([{'name': 'c', 'model': 'gpt-4o', 'params': {'temperature': value}}])


def test_yaml_nan_in_params_is_refused_at_load(tmp_path):
    path = tmp_path / 'llm.yaml'
    path.write_text('llm:\n  - {name: c, model: gpt-4o, params: {temperature: .nan}}\n')
    with pytest.raises(ConfigError, match='connection "c": field "params": params must be JSON'):
        mod_config.load_file(path)


def test_a_connection_config_built_by_hand_is_complete():
    from llmconn.connection import Connection
    from llmconn.skills import SkillCache
    from llmconn.store import open_store

    conf = mod_config.ConnectionConfig(name='a', model='claude-x')
    assert (conf.provider, conf.address) == ('claude', 'https://api.anthropic.com')
    store = open_store('memory://')
    conn = Connection(conf, store, SkillCache('.'))      # KeyError: '' before
    try:
        assert conn.provider.name == 'claude'
    finally:
        conn.close()
        store.close()
    with pytest.raises(ValueError, match='unknown provider'):
        mod_config.ConnectionConfig(name='a', model='m', provider='nope')


@pytest.mark.parametrize('text, error', [
    ('llm: ' + '[' * 20000 + ']' * 20000 + '\n', 'nested more than 64 levels'),     # RecursionError before
    ('llm: "' + 'x' * 1_000_001 + '"\n', 'more than a configuration needs'),
])
def test_a_hostile_file_is_a_config_error_not_a_crash_or_a_stall(tmp_path, text, error):
    path = tmp_path / 'llm.yaml'
    path.write_text(text)
    with pytest.raises(ConfigError, match=error):
        mod_config.load_file(path)


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path):
    path = tmp_path / 'llm.yaml'
    path.write_bytes(b'llm: \xff\xfe\n')
    with pytest.raises(ConfigError, match='not UTF-8'):
        mod_config.load_file(path)
