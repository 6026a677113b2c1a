"""Caching by default (SPEC §17): where llmconn puts Claude's breakpoints, OpenAI's prompt_cache_key.

The bodies are held to the SDK types; the end-to-end tests run a real
connection, Redis and the fake provider, whose caching model bills as the
real APIs do (tests/test_caching_fake.py), and read the billed counts back.
"""

from __future__ import annotations

import json

import pytest
from anthropic.types import MessageCreateParams
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming

from llmconn.providers.caching import MAX_BREAKPOINTS, chat_cache_key
from llmconn.types import Request, Turn

from provider_helpers import assert_valid, make_provider

SKILL = ' '.join(f'rule{i}' for i in range(400))        # 400 words, well past 1,024 bytes
EPHEMERAL = {'type': 'ephemeral'}


def marks(body: dict) -> list[tuple]:
    """Where ``body`` carries cache_control: ('system', i), ('tools', i), (message index, block index)."""
    found = [('top', 0)] if body.get('cache_control') else []
    for where in ('tools', 'system'):
        value = body.get(where)
        found += [(where, i) for i, b in enumerate(value if isinstance(value, list) else []) if 'cache_control' in b]
    for m, message in enumerate(body['messages']):
        content = message['content']
        found += [(m, i) for i, b in enumerate(content if isinstance(content, list) else []) if 'cache_control' in b]
    return found


def history(n: int, words: int = 40) -> tuple:
    return tuple(Turn(f'question {i} ' + 'x ' * words, f'answer {i} ' + 'y ' * words) for i in range(n))


def test_claude_marks_the_skill_the_history_end_and_the_last_block():
    provider = make_provider('claude', model='claude-sonnet-5-5')
    body = provider.build_request(Request('the new question', system=SKILL, history=history(3)))
    assert marks(body) == [('system', 0), (5, 0), (6, 0)]
    assert body['system'] == [{'type': 'text', 'text': SKILL, 'cache_control': EPHEMERAL}]
    assert body['messages'][5]['content'] == [{'type': 'text', 'text': 'answer 2 ' + 'y ' * 40,
                                               'cache_control': EPHEMERAL}]
    assert_valid(MessageCreateParams, body)


def test_claude_short_prompt_keeps_its_plain_body():
    provider = make_provider('claude', model='claude-sonnet-5-5')
    body = provider.build_request(Request('hi', system='be terse', history=history(1, words=2)))
    assert marks(body) == [] and body['system'] == 'be terse'


def test_claude_cache_off_places_nothing_and_one_hour_ttl_is_sent():
    off = make_provider('claude', model='claude-sonnet-5-5', cache='off')
    assert marks(off.build_request(Request('q', system=SKILL, history=history(3)))) == []
    hour = make_provider('claude', model='claude-sonnet-5-5', cache_ttl='1h')
    body = hour.build_request(Request('q', system=SKILL, history=history(3)))
    assert body['system'][0]['cache_control'] == {'type': 'ephemeral', 'ttl': '1h'}
    assert_valid(MessageCreateParams, body)


def test_claude_without_a_skill_marks_the_last_tool():
    from llmconn.tools import Tool
    tool = Tool(name='lookup', description='d ' * 600, parameters={'type': 'object', 'properties': {}})
    provider = make_provider('claude', model='claude-sonnet-5-5')
    body = provider.build_request(Request('q', tools=(tool,)))
    assert marks(body) == [('tools', 0), (0, 0)]
    assert_valid(MessageCreateParams, body)


def test_claude_never_exceeds_four_breakpoints_with_the_callers_own():
    provider = make_provider('claude', model='claude-sonnet-5-5', params={'cache_control': EPHEMERAL})
    body = provider.build_request(Request('q', system=SKILL, history=history(3)))
    assert len(marks(body)) == MAX_BREAKPOINTS            # the caller's top-level one and our three
    mine = [{'type': 'text', 'text': SKILL, 'cache_control': EPHEMERAL}] * 3      # a caller's own three
    body = make_provider('claude', model='claude-sonnet-5-5').build_request(
        Request('q', history=history(3), system=''))
    body['system'] = mine
    from llmconn.providers.caching import place_breakpoints
    place_breakpoints(body, 6, '5m')
    assert len(marks(body)) == MAX_BREAKPOINTS


def test_claude_stored_natives_are_not_changed_by_a_mark():
    provider = make_provider('claude', model='claude-sonnet-5-5')
    native = {'type': 'text', 'text': 'answer ' * 300, 'citations': [{'type': 'char_location', 'cited_text': 'a',
              'document_index': 0, 'document_title': None, 'start_char_index': 0, 'end_char_index': 1}]}
    turn = Turn('q', native['text'], items=({'kind': 'text', 'text': native['text'], 'native': native},),
                tag=provider.tag)
    body = provider.build_request(Request('next', history=(turn,)))
    assert 'cache_control' not in native and 'cache_control' in body['messages'][1]['content'][-1]


def test_openai_prompt_cache_key_is_a_stable_hash_per_connection_and_chat():
    key = chat_cache_key('Support', 'order-4711')
    assert key == chat_cache_key('Support', 'order-4711') and 'order-4711' not in key and 'Support' not in key
    assert len({key, chat_cache_key('Support', 'order-4712'), chat_cache_key('Sales', 'order-4711')}) == 3
    assert chat_cache_key('Support', '') == ''
    for kind, sdk_type in (('openai', CompletionCreateParamsNonStreaming),
                           ('openai-responses', ResponseCreateParamsNonStreaming)):
        body = make_provider(kind).build_request(Request('q', cache_key=key))
        assert body['prompt_cache_key'] == key
        assert_valid(sdk_type, body)
        assert 'prompt_cache_key' not in make_provider(kind, cache='off').build_request(Request('q', cache_key=key))
        assert 'prompt_cache_key' not in make_provider(kind).build_request(Request('q'))


def test_config_refuses_unknown_cache_modes_and_ttls():
    from llmconn.config import load_dict
    from llmconn.errors import ConfigError
    for field, value in (('cache', 'on'), ('cache_ttl', '10m')):
        with pytest.raises(ConfigError, match=field):
            load_dict({'llm': [{'name': 'c', 'model': 'claude-sonnet-5-5', field: value}]})


# ---- end to end: a chat on the fake provider, billed by its caching model


@pytest.fixture
def chat_on(redis_url, provider, unique, open_registry, tmp_path):
    skill = tmp_path / 'skills' / 'long' / 'SKILL.md'
    skill.parent.mkdir(parents=True)
    words = ' '.join(f'{unique}-{i}' for i in range(2000))
    skill.write_text(f'---\nname: long\ndescription: a long skill\n---\n{words}\n')

    def make(kind: str, model: str, path: str = '', **conn):
        conf = {'name': unique, 'provider': kind, 'model': model, 'address': provider.url + path,
                'max_retries': 0, **conn}
        return open_registry({'redis': {'url': redis_url}, 'skills_dir': str(tmp_path / 'skills'),
                              'llm': [conf]})[unique]
    return make


def test_claude_chat_reads_the_skill_and_history_from_the_cache(chat_on, provider):
    conn = chat_on('claude', 'claude-sonnet-5-5')
    usages = [conn.chat(f'question {i} ' + 'z ' * 200, chat_id='c', skill='long')['usage'] for i in range(3)]
    # Call 1 writes the skill and its message; call 2 reads them and writes the reply and its message.
    assert (usages[0]['cache_read_tokens'], usages[0]['cache_write_tokens']) == (0, usages[0]['input_tokens'])
    first = usages[0]['input_tokens']
    assert usages[1]['cache_read_tokens'] == first
    assert usages[1]['cache_write_tokens'] == usages[1]['input_tokens'] - first
    assert usages[2]['cache_read_tokens'] == usages[1]['input_tokens']
    sent = [r['body'] for r in provider.requests if r['path'] == '/v1/messages']
    assert [len(marks(b)) for b in sent] == [2, 3, 3]


def test_claude_stream_done_carries_the_cache_counts(chat_on):
    conn = chat_on('claude', 'claude-sonnet-5-5')
    conn.chat('one', chat_id='s', skill='long')
    done = list(conn.stream('two', chat_id='s', skill='long'))[-1].result
    assert done['usage']['cache_read_tokens'] > 2000 and done['usage']['cache_write_tokens'] > 0


def test_openai_chat_sends_its_key_and_reads_the_cached_prefix(chat_on, provider, unique):
    conn = chat_on('openai', 'gpt-4o-mini', '/v1')
    conn.chat('first question', chat_id='user-ann', skill='long')
    second = conn.chat('second question', chat_id='user-ann', skill='long')['usage']
    # Call 1 sent 2,002 words (skill, question): kept in 128-word steps from 1,024, so 1,920 are read.
    assert second['cache_read_tokens'] == 1920
    keys = {r['body'].get('prompt_cache_key') for r in provider.requests if r['path'] == '/v1/chat/completions'}
    assert keys == {chat_cache_key(unique, 'user-ann')}
    # The chat id is not hex, so the hash cannot hold it by chance.
    assert 'user-ann' not in json.dumps(sorted(keys))


def test_the_shipped_responses_template_maps_cached_tokens(redis_url, provider, unique, open_registry):
    from pathlib import Path
    templates = Path(__file__).resolve().parent.parent / 'etc' / 'templates'
    conf = {'name': unique, 'provider': 'template', 'model': 'gpt-5-mini', 'address': provider.url + '/v1/responses',
            'max_retries': 0, 'request_template_file': str(templates / 'openai-responses.request.j2'),
            'response_template_file': str(templates / 'openai-responses.response.j2')}
    conn = open_registry({'redis': {'url': redis_url}, 'llm': [conf]})[unique]
    text = ' '.join(f'{unique}-{i}' for i in range(1100))
    assert conn.invoke(text)['usage']['cache_read_tokens'] == 0
    usage = conn.invoke(text)['usage']
    assert usage == {'input_tokens': 1100, 'output_tokens': usage['output_tokens'], 'cache_read_tokens': 1024,
                     'cache_write_tokens': 0, 'reasoning_tokens': 0}
