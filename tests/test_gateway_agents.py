"""The OpenAI Agents SDK (``agents``) against ``llmconn serve``, on every backend kind with function tools.

A real agent client, as its users run it: ``store`` left at its default, no
``include``, the whole conversation sent back in ``input`` (or chained with
``previous_response_id``), the SDK's Responses model and its Chat Completions
model. The fake provider refuses (and records a violation) whatever the real
API would: Claude's ``tool_use`` replayed without its signed thinking, a
Gemini ``functionCall`` without its ``thoughtSignature``, a Responses
``function_call`` without its reasoning item. Beyond that, every tool turn
of the conversation, the earlier ones included, must reach the backend with
its provider items (:func:`check_provider_items`). Every Response body and
stream the gateway sent is validated with ``openresponses-types`` and the
SDK's types (:mod:`conformance_checks`).

Tracing is off: the SDK would export spans to api.openai.com.
"""

import asyncio

import httpx2 as httpx     # the HTTP client the openai SDK is built on
import pytest
from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner,
                    function_tool, set_tracing_disabled)
from openai import AsyncOpenAI, BadRequestError
from openai.types.shared import Reasoning

from agent_backends import ASK, ASK_AGAIN, BACKENDS, check_provider_items, order
from agent_backends import bodies, gw  # noqa: F401 (fixtures every client module shares)
from gateway_stack import KEYS
from llmconn.gateway.call_registry import call_key

set_tracing_disabled(True)


@function_tool
def get_order(order_id: str) -> str:
    """Look an order up."""
    return order(order_id)


@function_tool
def find_order(customer: str) -> str:
    """Find a customer's order; the fake model then looks it up (a second round of the same turn)."""
    return 'call get_order {"order_id": "C-3"}'


@pytest.fixture
def client(gw, bodies):
    """Makes the SDK's client; a new one for each event loop (each ``run``), as its connections are the loop's."""
    def make() -> AsyncOpenAI:
        http = httpx.AsyncClient(event_hooks={'response': [bodies.hook]}, timeout=20)
        return AsyncOpenAI(base_url=gw.url(), api_key=KEYS['a'][0], max_retries=0, http_client=http)
    return make


def agent(client, backend: str, chat: bool = False, tools: tuple = (get_order,)) -> Agent:
    client = client()
    kind = OpenAIChatCompletionsModel if chat else OpenAIResponsesModel
    # A Responses backend reasons when asked to (reasoning_effort on the Chat route, which has no summary);
    # Claude's and Gemini's thinking is their connection's.
    settings = ModelSettings(reasoning=Reasoning(effort='low', summary=None if chat else 'auto')) \
        if backend.startswith('Responses') else ModelSettings()
    return Agent(name='orders', instructions='Answer from the tools.', tools=list(tools),
                 model=kind(model=backend, openai_client=client), model_settings=settings)


def run(coroutine):
    return asyncio.run(coroutine)


@pytest.mark.parametrize('backend', BACKENDS)
def test_a_function_tool_run(gw, client, bodies, backend):
    gw.fake.clear()
    result = run(Runner.run(agent(client, backend), ASK))
    assert result.final_output == 'tool said: order A-17 shipped'
    assert gw.fake.violations == []
    check_provider_items(gw, backend, 1)
    assert len(bodies.responses) == 2 and bodies.responses[0]['output'][-1]['type'] == 'function_call'


@pytest.mark.parametrize('backend', BACKENDS)
def test_a_second_tool_turn_replays_the_first_with_its_provider_items(gw, client, backend):
    """The SDK sends the whole conversation back (``to_input_list``): both tool turns keep their items."""
    first = run(Runner.run(agent(client, backend), ASK))
    gw.fake.clear()
    second = run(Runner.run(agent(client, backend), first.to_input_list() + [{'role': 'user', 'content': ASK_AGAIN}]))
    assert second.final_output == 'tool said: order B-2 shipped'
    assert gw.fake.violations == []
    check_provider_items(gw, backend, 2)


@pytest.mark.parametrize('chat', [False, True], ids=['responses', 'chat'])
@pytest.mark.parametrize('backend', BACKENDS)
def test_every_round_of_a_turn_keeps_its_provider_items(gw, client, backend, chat):
    """One user turn, two rounds of calls: the second round's request carries the first round's items."""
    gw.fake.clear()
    result = run(Runner.run(agent(client, backend, chat, tools=(find_order, get_order)),
                            'call find_order {"customer": "ada"}'))
    assert result.final_output == 'tool said: order C-3 shipped'
    assert gw.fake.violations == []
    check_provider_items(gw, backend, 2)


@pytest.mark.parametrize('chat', [False, True], ids=['responses', 'chat'])
@pytest.mark.parametrize('backend', BACKENDS)
def test_a_streamed_run(gw, client, bodies, backend, chat):
    gw.fake.clear()

    async def streamed():
        result = Runner.run_streamed(agent(client, backend, chat), ASK)
        deltas = [e.data.delta async for e in result.stream_events()
                  if e.type == 'raw_response_event' and e.data.type == 'response.output_text.delta']
        return result, deltas

    result, deltas = run(streamed())
    assert result.final_output == ''.join(deltas) == 'tool said: order A-17 shipped'
    assert gw.fake.violations == []
    check_provider_items(gw, backend, 1)
    ends = [e for e in bodies.events if e['type'] == 'response.completed']
    assert len(ends) == (0 if chat else 2) and all(e['response']['output'][-1]['type'] == 'function_call'
                                                  for e in ends[:1])


@pytest.mark.parametrize('backend', BACKENDS)
def test_a_previous_response_id_chain(gw, client, bodies, backend):
    """Each model call of the run continues the last by id; the next run continues the chain."""
    first = run(Runner.run(agent(client, backend), ASK, auto_previous_response_id=True))
    assert first.final_output == 'tool said: order A-17 shipped'
    gw.fake.clear()
    second = run(Runner.run(agent(client, backend), ASK_AGAIN, previous_response_id=first.last_response_id))
    assert second.final_output == 'tool said: order B-2 shipped'
    assert gw.fake.violations == []
    check_provider_items(gw, backend, 0 if backend == 'Responses' else 2)     # the backend keeps its chain
    chained = [r['previous_response_id'] for r in bodies.responses]
    assert chained[0] is None and all(chained[1:]) and chained[1:] == [r['id'] for r in bodies.responses[:-1]]


@pytest.mark.parametrize('backend', BACKENDS)
def test_the_chat_completions_model(gw, client, backend):
    first = run(Runner.run(agent(client, backend, chat=True), ASK))
    assert first.final_output == 'tool said: order A-17 shipped'
    gw.fake.clear()
    second = run(Runner.run(agent(client, backend, chat=True),
                            first.to_input_list() + [{'role': 'user', 'content': ASK_AGAIN}]))
    assert second.final_output == 'tool said: order B-2 shipped'
    assert gw.fake.violations == []
    check_provider_items(gw, backend, 2)


def test_zero_retention_keeps_no_provider_items_and_says_what_to_do(gw):
    """A zero-retention key's calls go back as the client sent them: Claude with thinking wants more."""
    async def scenario():
        client = AsyncOpenAI(base_url=gw.url(), api_key=KEYS['zero'][0], max_retries=0)
        return await Runner.run(agent(lambda: client, 'Claude'), ASK)

    with pytest.raises(BadRequestError) as refused:
        run(scenario())
    assert refused.value.body['code'] == 'reasoning_required'
    assert not list(gw.redis.scan_iter(match=call_key(KEYS['zero'][1], '*').rsplit(':', 1)[0] + ':*'))
