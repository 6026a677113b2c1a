"""``Tool.strict`` in each provider's request, checked against the SDKs' tool types.

OpenAI (both APIs) and Claude take ``strict`` on the tool; Gemini has none
per function, so a strict tool asks for ``VALIDATED`` function calling for
the request. An unset ``strict`` leaves each provider's default.
"""

from __future__ import annotations

import pytest
from anthropic.types import ToolParam
from openai.types.chat import ChatCompletionFunctionToolParam
from openai.types.responses import FunctionToolParam

from llmconn.tools import Tool
from llmconn.types import Request

from provider_helpers import assert_valid, make_provider

SCHEMA = {'type': 'object', 'properties': {'order_id': {'type': 'string'}}, 'required': ['order_id'],
          'additionalProperties': False}


def _tools(provider: str, strict: bool | None) -> dict:
    body = make_provider(provider).build_request(Request(text='hi', tools=(Tool('get_order', 'Look it up', SCHEMA,
                                                                                strict=strict),)))
    return body


@pytest.mark.parametrize('strict', [True, False])
def test_openai_responses_sends_strict_as_asked(strict):
    body = _tools('openai-responses', strict)
    assert_valid(FunctionToolParam, body['tools'][0])
    assert body['tools'][0]['strict'] is strict


def test_openai_responses_sends_false_when_strict_is_unset():
    assert _tools('openai-responses', None)['tools'][0]['strict'] is False     # the API's own default, stated


@pytest.mark.parametrize('strict', [True, False, None])
def test_chat_completions_sends_function_strict_only_when_set(strict):
    tool = _tools('openai', strict)['tools'][0]
    assert_valid(ChatCompletionFunctionToolParam, tool)
    assert tool['function'].get('strict') is strict


@pytest.mark.parametrize('strict', [True, False, None])
def test_claude_sends_strict_only_when_set(strict):
    tool = _tools('claude', strict)['tools'][0]
    assert_valid(ToolParam, tool)
    assert tool.get('strict') is strict


def test_gemini_asks_for_validated_calls_when_a_tool_is_strict():
    assert _tools('gemini', True)['toolConfig'] == {'functionCallingConfig': {'mode': 'VALIDATED'}}
    for strict in (False, None):
        assert 'toolConfig' not in _tools('gemini', strict)
