"""``POST /v1/responses/compact`` (SPEC §17) through ``llmconn serve``, with the official ``openai`` SDK.

The compacted response validates as the SDK's ``CompactedResponse``; its
output, sent as the next request's input, reaches the provider as the
summary in the system prompt. The fake provider echoes what it was asked, so
the summary shows the conversation it was made from.
"""

from __future__ import annotations

import openai
import pytest
from openai.types.responses import CompactedResponse

from gateway_stack import GatewayStack, create
from llmconn.compaction import SUMMARY_HEADER

SUMMARIZER = '''  - {name: Summarized, provider: claude, model: claude-sonnet-5-5, address: "FAKE_URL", max_retries: 0,
     compaction: {connection: Summarizer, instructions: "COMPACT-IT"}}
  - {name: Summarizer, provider: claude, model: claude-haiku-5-5, address: "FAKE_URL", max_retries: 0}'''


@pytest.fixture(scope='module')
def gw():
    stack = GatewayStack(processes=1, extra_llm=SUMMARIZER)
    yield stack
    stack.close()


def compacted(client, **kw) -> CompactedResponse:
    raw = client.responses.with_raw_response.compact(**kw)
    return CompactedResponse.model_validate(raw.http_response.json())


def claude_bodies(gw) -> list[dict]:
    return [r['body'] for r in gw.fake.requests if r['path'] == '/v1/messages']


def test_a_stored_conversation_compacts_into_one_item_the_next_request_takes(gw):
    client = gw.client('a')
    first = create(client, model='Chat', input='my order is A-17', instructions='be brief')
    gw.fake.clear()
    result = compacted(client, model='Chat', previous_response_id=first.id, instructions='be brief',
                       input=[{'role': 'user', 'content': 'and it is late'}])
    [item] = result.output
    assert item.type == 'compaction' and result.object == 'response.compaction'
    assert result.usage.input_tokens > 0 and result.usage.output_tokens > 0
    [asked] = [r['body'] for r in gw.fake.requests if r['path'] == '/v1/chat/completions']
    prompt = asked['messages'][-1]['content']
    assert 'User: my order is A-17' in prompt and 'User: and it is late' in prompt and 'be brief' in prompt
    gw.fake.clear()
    follow = create(client, model='Chat', input=[item.model_dump(mode='json', exclude_none=True),
                                                 {'role': 'user', 'content': 'what was my order?'}])
    assert follow.status == 'completed'
    [sent] = [r['body'] for r in gw.fake.requests if r['path'] == '/v1/chat/completions']
    system = sent['messages'][0]
    assert system['role'] in ('system', 'developer') and system['content'].startswith(SUMMARY_HEADER)
    assert 'my order is A-17' in system['content']


def test_a_connection_with_compaction_summarizes_with_its_summarizer(gw):
    client = gw.client('a')
    gw.fake.clear()
    compacted(client, model='Summarized', input='remember the number 42')
    [body] = claude_bodies(gw)
    assert body['model'] == 'claude-haiku-5-5' and 'COMPACT-IT' in body['messages'][-1]['content']


def test_a_compaction_item_not_made_here_is_a_400_naming_the_field(gw):
    client = gw.client('a')
    with pytest.raises(openai.BadRequestError, match='encrypted_content'):
        client.responses.create(model='Chat', input=[{'type': 'compaction', 'encrypted_content': 'opaque-bytes'},
                                                     {'role': 'user', 'content': 'hi'}])
    with pytest.raises(openai.BadRequestError, match='input or previous_response_id is required'):
        client.responses.compact(model='Chat')
