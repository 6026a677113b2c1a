"""LangChain's ``ChatOpenAI`` against ``llmconn serve``, on Chat Completions and Responses, every backend kind.

As its users run it: ``bind_tools`` with a tool, the tool loop written out
(the model's ``tool_calls`` run, ``ToolMessage`` outputs appended), the
message list replayed whole on each call, ``stream`` chunks added up into
one message. With ``use_responses_api=True`` LangChain sends the gateway's
output items back as it got them (reasoning items included, no ``include``).
Every answer and stream is checked against the SDK types and Open Responses
as it arrives (:class:`agent_backends.Bodies`).
"""

import httpx2 as httpx     # the HTTP client the openai SDK is built on
import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from agent_backends import (ANSWER, ANSWER_AGAIN, ANSWER_THIRD, ASK, ASK_AGAIN, ASK_THIRD, BACKENDS, PLAIN,
                            check_clean, order)
from agent_backends import bodies, gw  # noqa: F401 (fixtures every client module shares)
from gateway_stack import KEYS

ROUTES = ['chat', 'responses']


@tool
def get_order(order_id: str) -> str:
    """Look an order up."""
    return order(order_id)


@pytest.fixture
def model(gw, bodies):
    def make(backend: str, route: str) -> ChatOpenAI:
        # A Responses backend reasons when asked to (reasoning_effort on the Chat route, which has no summary);
        # Claude's and Gemini's thinking is their connection's.
        reasoning = {}
        if backend.startswith('Responses'):
            reasoning = {'reasoning': {'effort': 'low', 'summary': 'auto'}} if route == 'responses' else \
                {'reasoning_effort': 'low'}
        return ChatOpenAI(model=backend, base_url=gw.url(), api_key=KEYS['a'][0], max_retries=0, timeout=20,
                          use_responses_api=route == 'responses', **reasoning,
                          http_client=httpx.Client(event_hooks={'response': [bodies.sync_hook]}, timeout=20))
    return make


def run_tools(messages: list, message) -> None:
    """Append ``message`` and an output for each of its tool calls."""
    messages.append(message)
    for call in message.tool_calls:
        messages.append(ToolMessage(get_order.invoke(call['args']), tool_call_id=call['id']))


def tool_turn(chat, messages: list, ask: str) -> str:
    """One user turn with a tool round: the call, its output sent back, the answer."""
    messages.append(HumanMessage(ask))
    called = chat.invoke(messages)
    assert called.tool_calls and called.tool_calls[0]['name'] == 'get_order', called
    run_tools(messages, called)
    answer = chat.invoke(messages)
    messages.append(answer)
    return answer.text


def streamed(chat, messages: list):
    """The chunks of a streamed answer to ``messages``, and the message they add up to."""
    chunks = list(chat.stream(messages))
    total = chunks[0]
    for chunk in chunks[1:]:
        total = total + chunk
    return chunks, total


@pytest.mark.parametrize('route', ROUTES)
@pytest.mark.parametrize('backend', BACKENDS)
def test_a_plain_answer(gw, model, bodies, backend, route):
    assert model(backend, route).invoke(PLAIN).text == 'echo: hello there | users: 1 | previous: - | system: no'
    assert len(bodies.completions if route == 'chat' else bodies.responses) == 1


@pytest.mark.parametrize('route', ROUTES)
@pytest.mark.parametrize('backend', BACKENDS)
def test_bound_tools_round_trip(gw, model, bodies, backend, route):
    gw.fake.clear()
    assert tool_turn(model(backend, route).bind_tools([get_order]), [], ASK) == ANSWER
    check_clean(gw, backend, 1)
    assert len(bodies.completions if route == 'chat' else bodies.responses) == 2


@pytest.mark.parametrize('route', ROUTES)
@pytest.mark.parametrize('backend', BACKENDS)
def test_a_conversation_replays_its_earlier_tool_turn(gw, model, backend, route):
    chat = model(backend, route).bind_tools([get_order])
    messages: list = []
    tool_turn(chat, messages, ASK)
    gw.fake.clear()
    assert tool_turn(chat, messages, ASK_AGAIN) == ANSWER_AGAIN
    check_clean(gw, backend, 2)


@pytest.mark.parametrize('route', ROUTES)
@pytest.mark.parametrize('backend', BACKENDS)
def test_a_streamed_tool_turn_after_another(gw, model, bodies, backend, route):
    """The call streamed and added up, its output sent back, the answer streamed: both after a tool turn."""
    chat = model(backend, route).bind_tools([get_order])
    messages: list = []
    tool_turn(chat, messages, ASK)
    messages.append(HumanMessage(ASK_THIRD))
    _, called = streamed(chat, messages)
    assert [c['args'] for c in called.tool_calls] == [{'order_id': 'C-3'}], called
    run_tools(messages, called)
    gw.fake.clear()
    chunks, answer = streamed(chat, messages)
    assert answer.text == ANSWER_THIRD and len([c for c in chunks if c.text]) > 1
    check_clean(gw, backend, 2)
    assert bodies.chunks if route == 'chat' else bodies.events


@pytest.mark.parametrize('backend', BACKENDS)
def test_a_previous_response_id_chain(gw, model, bodies, backend):
    """``use_previous_response_id``: LangChain sends only the messages after its last answer, chained by id."""
    chat = model(backend, 'responses')
    chat.use_previous_response_id = True
    chat = chat.bind_tools([get_order])
    messages: list = []
    tool_turn(chat, messages, ASK)
    gw.fake.clear()
    assert tool_turn(chat, messages, ASK_AGAIN) == ANSWER_AGAIN
    check_clean(gw, backend, 0 if backend == 'Responses' else 2)     # a provider-state backend keeps its chain
    chained = [r['previous_response_id'] for r in bodies.responses]
    assert chained[0] is None and chained[1:] == [r['id'] for r in bodies.responses[:-1]]
