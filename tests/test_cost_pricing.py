"""Prices and cost (SPEC §17): ``pricing`` per connection, cost in integer micro-USD."""

from __future__ import annotations

import pytest

from llmconn.config import Pricing, load_dict
from llmconn.errors import ConfigError
from llmconn.pricing import cost_micro_usd

CLAUDE_SONNET = {'input': 3, 'output': 15, 'cache_read': 0.3, 'cache_write': 3.75}


def test_cost_prices_each_part_of_the_input_and_the_output():
    usage = {'input_tokens': 12_000, 'cache_read_tokens': 10_000, 'cache_write_tokens': 1_500, 'output_tokens': 400}
    # 500 uncached x 3 + 1,500 written x 3.75 + 10,000 read x 0.3 + 400 out x 15, in micro-USD
    assert cost_micro_usd(Pricing(**CLAUDE_SONNET), usage) == 1500 + 5625 + 3000 + 6000
    assert cost_micro_usd(None, usage) == 0


def test_cache_prices_default_to_the_input_price():
    usage = {'input_tokens': 100, 'cache_read_tokens': 60, 'cache_write_tokens': 40, 'output_tokens': 10}
    assert cost_micro_usd(Pricing(input=2, output=8), usage) == 200 + 80


@pytest.mark.parametrize('pricing', [{'input': -1, 'output': 1}, {'input': 1}, {'input': 1, 'output': 1, 'x': 2}])
def test_bad_pricing_fails_at_load_naming_the_field(pricing):
    with pytest.raises(ConfigError, match='pricing'):
        load_dict({'llm': [{'name': 'c', 'model': 'claude-sonnet-5-5', 'pricing': pricing}]})


def test_a_priced_chat_reports_its_cost_with_its_usage(redis_url, provider, unique, open_registry):
    conf = {'name': unique, 'model': 'claude-sonnet-5-5', 'address': provider.url, 'max_retries': 0,
            'pricing': CLAUDE_SONNET}
    conn = open_registry({'redis': {'url': redis_url}, 'llm': [conf]})[unique]
    usage = conn.chat('what does this cost?', chat_id='c')['usage']
    assert usage['cost'] == usage['input_tokens'] * 3 + usage['output_tokens'] * 15
    unpriced = open_registry({'redis': {'url': redis_url}, 'llm': [dict(conf, pricing=None)]})[unique]
    assert 'cost' not in unpriced.invoke('and this?')['usage']


def test_the_admin_usage_table_shows_cache_reasoning_and_cost():
    from llmconn.admin_page import usage_table
    row = {'day': '2026-12-01', 'connection': 'Support', 'model': 'm', 'key': '', 'calls': 2, 'errors': 0,
           'input_tokens': 5000, 'cache_read_tokens': 4000, 'cache_write_tokens': 600, 'output_tokens': 90,
           'reasoning_tokens': 30, 'tool_calls': 0, 'cost': 1_234_567}
    table = usage_table([row])
    assert '<th>Cache read</th><th>Cache write</th><th>Output</th><th>Reasoning</th>' in table
    cells = [c.split('>')[1] for c in table.split('<td class="n"')[1:]]
    assert [c.split('<')[0] for c in cells] == ['2', '0', '5000', '4000', '600', '90', '30', '0', '1.234567']


def test_the_ledger_keeps_cost_and_cache_counts_and_llmconn_usage_shows_them(redis_url, provider, unique,
                                                                             open_registry, tmp_path):
    from llmconn.usage_report import format_table, read_usage
    skill = tmp_path / 'skills' / 'long' / 'SKILL.md'
    skill.parent.mkdir(parents=True)
    skill.write_text('---\nname: long\ndescription: d\n---\n' + ' '.join(f'{unique}-{i}' for i in range(1500)))
    conf = {'name': unique, 'model': 'claude-sonnet-5-5', 'address': provider.url, 'max_retries': 0,
            'pricing': CLAUDE_SONNET}
    registry = open_registry({'redis': {'url': redis_url}, 'skills_dir': str(tmp_path / 'skills'), 'llm': [conf]})
    conn = registry[unique]
    # Saved chat turns count in the save script; the invoke in the in-process tally: both keep cost.
    usages = [conn.chat(f'question {i}', chat_id='c', skill='long')['usage'] for i in range(3)]
    usages.append(conn.invoke('one more', skill='long')['usage'])
    assert registry.usage.flush()
    [row] = read_usage(registry.store, connection=unique)
    for name in ('input_tokens', 'cache_read_tokens', 'cache_write_tokens', 'output_tokens', 'cost'):
        assert row[name] == sum(u[name] for u in usages), name
    assert row['cache_read_tokens'] > 0 and row['cost'] > 0
    table = format_table([row])
    assert 'CACHE_READ' in table and 'COST_USD' in table and f'{row["cost"] / 1e6:.6f}' in table
