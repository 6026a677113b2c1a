"""The fake providers' prompt caches bill as the real APIs do (see llmconn.testing.fake_cache).

The bench and the caching tests read billed tokens from the fake, so its
rules are pinned here, one per test: Claude's breakpoints, 20-block
lookback, 1,024-token minimum, lifetimes and 4-breakpoint limit; OpenAI's
automatic 128-token steps keyed by ``prompt_cache_key``; Gemini's implicit
cache. The SDK clients are pointed at the server and its usage parsed by
their types.
"""

from __future__ import annotations

import anthropic
import openai
import pytest
import requests

from llmconn.testing.fake_cache import CLAUDE_TTLS, MIN_CACHEABLE_TOKENS, PromptCache
from llmconn.testing.fake_server import FakeProviderServer

EPHEMERAL = {'type': 'ephemeral'}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope='module')
def srv():
    with FakeProviderServer() as server:
        yield server


@pytest.fixture
def clock(srv):
    clock = Clock()
    srv.state.cache = PromptCache(clock)
    return clock


@pytest.fixture
def claude(srv, clock):
    return anthropic.Anthropic(base_url=srv.url, api_key='x', max_retries=0)


def words(n: int, tag: str = 'w') -> str:
    return ' '.join(f'{tag}{i}' for i in range(n))


def system(n: int, mark: dict | None = EPHEMERAL, tag: str = 's') -> list:
    block = {'type': 'text', 'text': words(n, tag)}
    return [dict(block, cache_control=mark)] if mark else [block]


def ask(client, messages, **body):
    message = client.messages.create(model='claude-sonnet-5-5', max_tokens=50, messages=messages, **body)
    u = message.usage
    return u.input_tokens, u.cache_creation_input_tokens, u.cache_read_input_tokens


def test_claude_writes_a_marked_prefix_then_reads_it(claude):
    messages = [{'role': 'user', 'content': 'hello there'}]
    assert ask(claude, messages, system=system(2000)) == (2, 2000, 0)
    assert ask(claude, messages, system=system(2000)) == (2, 0, 2000)


def test_claude_prefix_below_the_minimum_is_neither_written_nor_read(claude):
    messages = [{'role': 'user', 'content': 'hi'}]
    short = MIN_CACHEABLE_TOKENS - 1
    assert ask(claude, messages, system=system(short)) == (short + 1, 0, 0)
    assert ask(claude, messages, system=system(short)) == (short + 1, 0, 0)


def test_claude_without_breakpoints_caches_nothing(claude):
    messages = [{'role': 'user', 'content': 'hi'}]
    assert ask(claude, messages, system=system(3000, None)) == (3001, 0, 0)
    assert ask(claude, messages, system=system(3000, None)) == (3001, 0, 0)


def conversation(turns: int, mark_last: bool = True) -> list:
    """``turns`` user/assistant pairs of 10 words each, then a user message marked as a breakpoint."""
    messages = []
    for i in range(turns):
        messages += [{'role': 'user', 'content': words(10, f'u{i}-')},
                     {'role': 'assistant', 'content': words(10, f'a{i}-')}]
    last = {'type': 'text', 'text': 'next question'}
    messages.append({'role': 'user', 'content': [dict(last, cache_control=EPHEMERAL) if mark_last else last]})
    return messages


def after_start(k: int, mark: int) -> list:
    """'start', then ``k`` messages alternating from the assistant's; block ``mark`` is the breakpoint.

    Block 0 is the system prompt, so message i is block i + 1.
    """
    messages = [{'role': 'user', 'content': 'start'}]
    messages += [{'role': ('assistant', 'user')[i % 2], 'content': f'm{i}'} for i in range(k)]
    message = messages[mark - 1]
    message['content'] = [{'type': 'text', 'text': message['content'], 'cache_control': EPHEMERAL}]
    return messages


@pytest.mark.parametrize('mark, hits', [(20, True), (21, False)])
def test_claude_breakpoint_finds_an_entry_at_most_19_blocks_before_it(claude, mark, hits):
    """Lookback: the breakpoint's own block and the 19 before it (20 in all) are checked."""
    ask(claude, after_start(0, 1), system=system(1500, None))          # an entry at block 1
    _, written, read = ask(claude, after_start(21, mark), system=system(1500, None))
    assert read == (1501 if hits else 0)
    assert written == (mark - 1 if hits else 1501 + mark - 1)       # one word per later block


def test_claude_five_minute_entry_expires_and_a_read_restarts_its_lifetime(claude, clock):
    messages = [{'role': 'user', 'content': 'hi'}]
    ask(claude, messages, system=system(1200))
    clock.now += CLAUDE_TTLS['5m'] - 1
    assert ask(claude, messages, system=system(1200))[2] == 1200       # read: its lifetime restarts
    clock.now += CLAUDE_TTLS['5m'] - 1
    assert ask(claude, messages, system=system(1200))[2] == 1200
    clock.now += CLAUDE_TTLS['5m'] + 1
    assert ask(claude, messages, system=system(1200)) == (1, 1200, 0)


def test_claude_one_hour_entry_outlives_five_minutes_and_is_billed_as_such(claude, clock):
    messages = [{'role': 'user', 'content': 'hi'}]
    hour = dict(EPHEMERAL, ttl='1h')
    message = claude.messages.create(model='claude-sonnet-5-5', max_tokens=50, messages=messages,
                                     system=system(1200, hour))
    assert message.usage.cache_creation.ephemeral_1h_input_tokens == 1200
    assert message.usage.cache_creation.ephemeral_5m_input_tokens == 0
    clock.now += CLAUDE_TTLS['5m'] * 2
    assert ask(claude, messages, system=system(1200, hour))[2] == 1200
    clock.now += CLAUDE_TTLS['1h'] + 1
    assert ask(claude, messages, system=system(1200, hour))[1] == 1200


def test_claude_more_than_four_breakpoints_is_a_400(claude):
    messages = conversation(2)
    for message in messages[:-1]:
        message['content'] = [{'type': 'text', 'text': message['content'], 'cache_control': EPHEMERAL}]
    with pytest.raises(anthropic.BadRequestError, match='A maximum of 4 blocks with cache_control'):
        ask(claude, messages)
    assert ask(claude, messages[1:][1:])[0] > 0     # four are accepted


def test_claude_top_level_cache_control_marks_the_last_block(claude):
    messages = [{'role': 'user', 'content': words(1100)}]
    assert ask(claude, messages, extra_body={'cache_control': EPHEMERAL}) == (0, 1100, 0)
    messages += [{'role': 'assistant', 'content': 'ok'}, {'role': 'user', 'content': 'more'}]
    assert ask(claude, messages, extra_body={'cache_control': EPHEMERAL}) == (0, 2, 1100)


def test_claude_tools_are_part_of_the_prefix(claude):
    tool = {'name': 'lookup', 'description': words(1100, 'd'), 'input_schema': {'type': 'object'},
            'cache_control': EPHEMERAL}
    messages = [{'role': 'user', 'content': 'hi'}]
    _, written, _ = ask(claude, messages, tools=[tool])
    assert written >= 1100
    assert ask(claude, messages, tools=[tool])[2] == written
    changed = dict(tool, description=words(1100, 'e'))
    assert ask(claude, messages, tools=[changed])[2] == 0


# ---- OpenAI: automatic prefix caching


@pytest.fixture
def oai(srv, clock):
    return openai.OpenAI(base_url=srv.url + '/v1', api_key='x', max_retries=0)


def test_openai_caches_from_1024_tokens_in_128_token_steps_per_cache_key(oai):
    messages = [{'role': 'system', 'content': words(1300)}, {'role': 'user', 'content': 'a b'}]
    first = oai.chat.completions.create(model='gpt-5', messages=messages, prompt_cache_key='k1')
    assert first.usage.prompt_tokens == 1302 and first.usage.prompt_tokens_details.cached_tokens == 0
    messages[-1]['content'] = 'c d e'
    second = oai.chat.completions.create(model='gpt-5', messages=messages, prompt_cache_key='k1')
    assert second.usage.prompt_tokens_details.cached_tokens == 1280     # 1024 + 2 x 128 <= 1300
    other = oai.chat.completions.create(model='gpt-5', messages=messages, prompt_cache_key='k2')
    assert other.usage.prompt_tokens_details.cached_tokens == 0


def test_openai_short_prompt_is_never_cached(oai):
    messages = [{'role': 'user', 'content': words(1000)}]
    for _ in range(2):
        usage = oai.chat.completions.create(model='gpt-5', messages=messages).usage
        assert usage.prompt_tokens_details.cached_tokens == 0


def test_openai_responses_report_cached_input_tokens(oai):
    for expected in (0, 1152):
        response = oai.responses.create(model='gpt-5', instructions=words(1200), input='hello', store=False,
                                        prompt_cache_key='chat-1')
        assert response.usage.input_tokens == 1201
        assert response.usage.input_tokens_details.cached_tokens == expected


def test_gemini_implicit_cache_is_reported(srv, clock):
    url = f'{srv.url}/v1beta/models/gemini-2.5-flash:generateContent'
    body = {'systemInstruction': {'parts': [{'text': words(1100)}]},
            'contents': [{'role': 'user', 'parts': [{'text': 'hi'}]}]}
    first = requests.post(url, json=body, headers={'x-goog-api-key': 'x'}).json()['usageMetadata']
    second = requests.post(url, json=body, headers={'x-goog-api-key': 'x'}).json()['usageMetadata']
    assert 'cachedContentTokenCount' not in first and first['promptTokenCount'] == 1101
    assert second['cachedContentTokenCount'] == 1101 and second['promptTokenCount'] == 1101
