"""Compaction (SPEC §17): what the window leaves behind is summarized once per step and sent after the skill.

Real Redis, real connections and the fake provider: the fake's echo reply
repeats the summarizing prompt it was sent, so the summaries show what went
into them, and the provider's record shows what each call sent.
"""

from __future__ import annotations

import pytest

from llmconn.compaction import SUMMARY_HEADER
from llmconn.config import load_dict
from llmconn.errors import ConfigError
from llmconn.usage_report import read_usage


@pytest.fixture
def registry(redis_url, provider, unique, open_registry):
    base = {'model': 'claude-sonnet-5-5', 'address': provider.url, 'max_retries': 0}
    return open_registry({'redis': {'url': redis_url}, 'llm': [
        dict(base, name=unique, max_history_turns=4, window_step=2,
             compaction={'connection': unique + '-sum', 'instructions': 'SUMMARIZE-THIS'}),
        dict(base, name=unique + '-sum')]})


def sent(provider) -> list[dict]:
    return [r['body'] for r in provider.requests if r['path'] == '/v1/messages']


def system_text(body: dict) -> str:
    system = body.get('system') or ''
    return system if isinstance(system, str) else ''.join(b['text'] for b in system)


def test_one_summarizing_call_per_step_folding_in_the_previous_summary(registry, provider, unique):
    conn = registry[unique]
    results = [conn.chat(f'q{i}', chat_id='c') for i in range(8)]
    bodies = sent(provider)
    prompts = [b for b in bodies if system_text(b) == '' and 'SUMMARIZE-THIS' in b['messages'][-1]['content']]
    chats = [b for b in bodies if b not in prompts]
    # Window of 3 turns moving 2 at a time: calls 4 and 6 start past turns; each summarizes the two left behind.
    assert len(prompts) == 2 and len(chats) == 8
    first, second = (p['messages'][-1]['content'] for p in prompts)
    assert 'User: q0' in first and 'User: q1' in first and 'Summary so far' not in first
    assert 'User: q2' in second and 'User: q3' in second and 'Summary so far:' in second
    assert 'User: q0' in second         # by way of the previous summary, which echoed it
    assert [SUMMARY_HEADER in system_text(b) for b in chats] == [False] * 4 + [True] * 4
    assert 'User: q2' in system_text(chats[6]) and 'User: q2' not in system_text(chats[5])
    assert [('compaction' in r['usage']) for r in results] == [False] * 4 + [True, False, True, False]
    assert results[4]['usage']['compaction']['input_tokens'] == len(first.split())
    assert conn.history('c')[0]['content'] == 'q0'      # the turns themselves stay stored


def test_the_summarizing_calls_count_under_their_connection(registry, provider, unique):
    conn = registry[unique]
    for i in range(7):
        conn.chat(f'q{i}', chat_id='c')
    assert registry.usage.flush()
    [row] = read_usage(registry.store, connection=unique + '-sum')
    assert row['calls'] == 2
    assert sum(r['calls'] for r in read_usage(registry.store, connection=unique)) == 7


def test_without_compaction_nothing_is_summarized(redis_url, provider, unique, open_registry):
    conn = open_registry({'redis': {'url': redis_url}, 'llm': [
        {'name': unique, 'model': 'claude-sonnet-5-5', 'address': provider.url, 'max_history_turns': 4,
         'window_step': 2}]})[unique]
    for i in range(7):
        conn.chat(f'q{i}', chat_id='c')
    assert len(sent(provider)) == 7 and not any(SUMMARY_HEADER in system_text(b) for b in sent(provider))


def test_compaction_must_name_a_connection_of_the_file():
    with pytest.raises(ConfigError, match='compaction.connection'):
        load_dict({'llm': [{'name': 'a', 'model': 'claude-sonnet-5-5', 'compaction': {'connection': 'nope'}}]})


def test_claude_keeps_the_skill_cached_when_the_summary_changes(redis_url, provider, unique, open_registry, tmp_path):
    skill = tmp_path / 'skills' / 'long' / 'SKILL.md'
    skill.parent.mkdir(parents=True)
    skill.write_text('---\nname: long\ndescription: d\n---\n' + ' '.join(f'{unique}-{i}' for i in range(2000)))
    base = {'model': 'claude-sonnet-5-5', 'address': provider.url, 'max_retries': 0}
    registry = open_registry({'redis': {'url': redis_url}, 'skills_dir': str(tmp_path / 'skills'), 'llm': [
        dict(base, name=unique, max_history_turns=4, window_step=2, compaction={'connection': unique + '-sum'}),
        dict(base, name=unique + '-sum')]})
    results = [registry[unique].chat(f'q{i}', chat_id='c', skill='long') for i in range(7)]
    chats = [b for b in sent(provider) if system_text(b)]
    system = chats[6]['system']
    assert [b.get('cache_control') for b in system] == [{'type': 'ephemeral'}, None]
    assert system[1]['text'].startswith(SUMMARY_HEADER) and system_text(chats[6]).startswith(f'{unique}-0 ')
    # Call 6 has a new summary and a moved window: only the skill's block is read from the cache.
    assert results[6]['usage']['cache_read_tokens'] == 2000
