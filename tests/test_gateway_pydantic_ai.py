"""pydantic-ai against ``llmconn serve``: its Chat Completions and Responses models on every backend kind.

As its users run it: an ``Agent`` with a function tool, the conversation
replayed from ``all_messages()`` (``message_history``), streaming with
``run_stream``. On Responses pydantic-ai decides from the model's profile
what goes back: a model it does not know as an OpenAI reasoning model (the
gateway's connection names) gets its reasoning back as ``<think>`` text
with the calls and outputs, no item ids, no ``include``; a reasoning
profile asks for ``include: ["reasoning.encrypted_content"]`` and sends the
reasoning items back with their ids and encrypted content. Both must reach
the backend with every tool turn's provider items (:mod:`agent_backends`).
"""

import asyncio

import httpx2 as httpx     # the HTTP client the openai SDK is built on
import pytest
from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.profiles.openai import OpenAIModelProfile
from pydantic_ai.providers.openai import OpenAIProvider

from agent_backends import (ANSWER, ANSWER_AGAIN, ANSWER_THIRD, ASK, ASK_AGAIN, ASK_THIRD, BACKENDS, PLAIN, Bodies,
                            check_clean, last_body, order)
from agent_backends import bodies, gw  # noqa: F401 (fixtures every client module shares)
from gateway_stack import KEYS

# The Chat Completions model; the Responses model with its default profile (reasoning replayed as text);
# the Responses model with a reasoning profile (include, reasoning items with ids and encrypted content).
KINDS = ['chat', 'responses', 'responses-encrypted']
REASONING_PROFILE = OpenAIModelProfile(openai_supports_encrypted_reasoning_content=True)


def get_order(order_id: str) -> str:
    """Look an order up."""
    return order(order_id)


@pytest.fixture
def agent(gw, bodies):
    """Makes an agent; a new client for each event loop (each ``run_sync``), as its connections are the loop's."""
    def make(backend: str, kind: str) -> Agent:
        http = httpx.AsyncClient(event_hooks={'response': [bodies.hook]}, timeout=20)
        client = AsyncOpenAI(base_url=gw.url(), api_key=KEYS['a'][0], max_retries=0, http_client=http)
        provider = OpenAIProvider(openai_client=client)
        if kind == 'chat':
            model = OpenAIChatModel(backend, provider=provider)
        else:
            model = OpenAIResponsesModel(backend, provider=provider,
                                         profile=REASONING_PROFILE if kind == 'responses-encrypted' else None)
        return Agent(model, tools=[get_order], instructions='Answer from the tools.',
                     model_settings=settings(backend, kind))
    return make


def settings(backend: str, kind: str) -> dict:
    """A Responses backend reasons when asked to (no summary on the Chat route); Claude's and Gemini's thinking
    is their connection's."""
    if not backend.startswith('Responses'):
        return {}
    return {'openai_reasoning_effort': 'low'} if kind == 'chat' else \
        {'openai_reasoning_effort': 'low', 'openai_reasoning_summary': 'auto'}


def check_bodies(bodies: Bodies, kind: str, answers: int) -> None:
    """Every answer was checked as it came, on the route the model speaks."""
    assert len(bodies.completions if kind == 'chat' else bodies.responses) == answers


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('backend', BACKENDS)
def test_a_plain_answer(gw, agent, bodies, backend, kind):
    result = agent(backend, kind).run_sync(PLAIN)
    assert result.output == 'echo: hello there | users: 1 | previous: - | system: yes'
    check_bodies(bodies, kind, 1)


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('backend', BACKENDS)
def test_a_function_tool_round_trip(gw, agent, bodies, backend, kind):
    gw.fake.clear()
    result = agent(backend, kind).run_sync(ASK)
    assert result.output == ANSWER
    check_clean(gw, backend, 1)
    check_bodies(bodies, kind, 2)
    if backend.startswith('Gemini'):    # pydantic-ai makes its tools strict: Gemini holds the calls to them
        assert last_body(gw, backend)['toolConfig'] == {'functionCallingConfig': {'mode': 'VALIDATED'}}
    if kind == 'responses-encrypted' and backend not in ('Chat', 'ClaudePlain'):
        # It asked for include, so the backend's items came sealed in the reasoning item (and went back so).
        assert bodies.responses[0]['output'][0]['encrypted_content'].startswith('llmconn.r1.')


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('backend', BACKENDS)
def test_a_conversation_replays_its_earlier_tool_turn(gw, agent, backend, kind):
    first = agent(backend, kind).run_sync(ASK)
    gw.fake.clear()
    second = agent(backend, kind).run_sync(ASK_AGAIN, message_history=first.all_messages())
    assert second.output == ANSWER_AGAIN
    check_clean(gw, backend, 2)


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('backend', BACKENDS)
def test_a_streamed_run_after_a_tool_turn(gw, agent, bodies, backend, kind):
    first = agent(backend, kind).run_sync(ASK)
    gw.fake.clear()

    async def streamed():
        async with agent(backend, kind).run_stream(ASK_THIRD, message_history=first.all_messages()) as run:
            return [delta async for delta in run.stream_text(delta=True, debounce_by=None)]

    deltas = asyncio.run(streamed())
    assert ''.join(deltas) == ANSWER_THIRD and len(deltas) > 1
    check_clean(gw, backend, 2)
    assert (bodies.chunks if kind == 'chat' else bodies.events), 'the answers were not streamed'


def test_only_a_message_that_is_all_tagged_thinking_is_left_out():
    """Thinking written back as text is the reasoning's summary; text around it is the client's own, and stays."""
    from llmconn.gateway.reasoning import restore

    def said(text):
        return {'type': 'message', 'role': 'assistant', 'text': text}

    items = [{'type': 'message', 'role': 'user', 'text': 'hi'},
             said('<think>\nsteps\n</think>\n<thinking>more</thinking>'), said('the answer'),
             {'type': 'message', 'role': 'user', 'text': 'and?'},
             said('<think>a</think> and then I said this'), said('I wrote <think>x</think>')]
    assert [i['text'] for i in restore(items, None)] == [
        'hi', 'the answer', 'and?', '<think>a</think> and then I said this', 'I wrote <think>x</think>']


@pytest.mark.parametrize('backend', BACKENDS)
def test_a_previous_response_id_chain(gw, agent, bodies, backend):
    """``openai_previous_response_id='auto'``: each request sends only what follows the last stored response."""
    def chained(prompt, history=None):
        model = agent(backend, 'responses')
        return model.run_sync(prompt, message_history=history,
                              model_settings={**settings(backend, 'responses'), 'openai_previous_response_id': 'auto'})

    first = chained(ASK)
    gw.fake.clear()
    second = chained(ASK_AGAIN, first.all_messages())
    assert second.output == ANSWER_AGAIN
    check_clean(gw, backend, 0 if backend == 'Responses' else 2)     # a provider-state backend keeps its chain
    chained = [r['previous_response_id'] for r in bodies.responses]
    assert chained[0] is None and chained[1:] == [r['id'] for r in bodies.responses[:-1]]
