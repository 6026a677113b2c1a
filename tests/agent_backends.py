"""What every third-party agent client test shares: the backend kinds, the calls to ask for, the checks.

Each client module (the OpenAI Agents SDK, pydantic-ai, LangChain, ``llm``)
drives one gateway of its own (:func:`gateway`) over the same backends: every
kind that runs function tools, thinking modes too. The fake provider refuses
(and records a violation) whatever the real API would; beyond that,
:func:`check_provider_items` proves that every tool turn of the conversation,
the earlier ones included, reached the backend with its provider items.
"""

from __future__ import annotations

import json

import httpx2 as httpx     # the HTTP client the openai SDK is built on
import pytest

from conformance_checks import check_chunk, check_completion, check_response, check_stream
from gateway_stack import GatewayStack

EXTRA = '''  - {name: ClaudePlain, provider: claude, model: claude-sonnet-5-5, address: "FAKE_URL", max_tokens: 2048,
     max_retries: 0}
  - {name: GeminiThinking, provider: gemini, model: gemini-2.5-pro, address: "FAKE_URL/v1beta", max_retries: 0,
     params: {generationConfig: {thinkingConfig: {includeThoughts: true}}}}'''
BACKENDS = ['Claude', 'ClaudePlain', 'Chat', 'Responses', 'ResponsesLocal', 'Gemini', 'GeminiThinking']
ASK = 'call get_order {"order_id": "A-17"}'
ASK_AGAIN = 'call get_order {"order_id": "B-2"}'
ASK_THIRD = 'call get_order {"order_id": "C-3"}'
ANSWER = 'tool said: order A-17 shipped'
ANSWER_AGAIN = 'tool said: order B-2 shipped'
ANSWER_THIRD = 'tool said: order C-3 shipped'
PLAIN = 'hello there'


def order(order_id: str) -> str:
    """What every client's ``get_order`` tool answers."""
    return f'order {order_id} shipped'


def gateway() -> GatewayStack:
    """One ``llmconn serve`` with every backend above (a module's fixture starts it once)."""
    return GatewayStack(processes=1, extra_llm=EXTRA)


@pytest.fixture(scope='module')
def gw():
    """The client module's gateway (a module imports this fixture, or defines its own ``gw``)."""
    stack = gateway()
    yield stack
    stack.close()


@pytest.fixture
def bodies():
    """A test's record of the gateway's answers, each checked."""
    return Bodies()


class Bodies:
    """What the gateway answered on /v1/responses and /v1/chat/completions, each body and event checked
    (:mod:`conformance_checks`) as it arrives; ``hook`` is an ``httpx`` response hook (``sync_hook`` for
    a synchronous client)."""

    def __init__(self) -> None:
        self.responses: list[dict] = []
        self.events: list[dict] = []
        self.completions: list[dict] = []
        self.chunks: list[dict] = []

    async def hook(self, response: httpx.Response) -> None:
        if self._ours(response):
            await response.aread()
            self._check(response)

    def sync_hook(self, response: httpx.Response) -> None:
        if self._ours(response):
            response.read()
            self._check(response)

    @staticmethod
    def _ours(response: httpx.Response) -> bool:
        path = response.request.url.path
        return response.status_code == 200 and path.endswith(('/responses', '/chat/completions'))

    def _check(self, response: httpx.Response) -> None:
        chat = response.request.url.path.endswith('/chat/completions')
        if not response.headers['content-type'].startswith('text/event-stream'):
            body = response.json()
            (check_completion if chat else check_response)(body)
            (self.completions if chat else self.responses).append(body)
            return
        data = [line[len('data: '):] for line in response.text.splitlines() if line.startswith('data: ')]
        if chat:
            assert data[-1] == '[DONE]', data[-1:]
            chunks = [json.loads(d) for d in data[:-1]]
            for chunk in chunks:
                check_chunk(chunk)
            self.chunks += chunks
        else:
            events = [json.loads(d) for d in data]
            check_stream(events)
            self.events += events


PATHS = {'Claude': '/messages', 'ClaudePlain': '/messages', 'Chat': '/chat/completions', 'Gemini': 'enerateContent',
         'GeminiThinking': 'enerateContent', 'Responses': '/responses', 'ResponsesLocal': '/responses'}


def last_body(gw, backend: str) -> dict:
    """The body of the last request the gateway sent to ``backend``'s provider."""
    return [r for r in gw.fake.requests if r['path'].endswith(PATHS[backend])][-1]['body']


def check_provider_items(gw, backend: str, tool_turns: int) -> None:
    """The last backend request carries ``tool_turns`` tool turns, each with its provider items."""
    body = last_body(gw, backend)
    if backend == 'Claude':
        turns = [m['content'] for m in body['messages'] if m['role'] == 'assistant' and isinstance(m['content'], list)
                 and any(b['type'] == 'tool_use' for b in m['content'])]
        assert all(t[0]['type'] == 'thinking' and t[0]['signature'] for t in turns), turns
    elif backend.startswith('Gemini'):
        turns = [p for c in body['contents'] if c['role'] == 'model' for p in c['parts'] if 'functionCall' in p]
        assert all(p.get('thoughtSignature') for p in turns), turns
    elif backend.startswith('Responses'):
        # Encrypted reasoning where the gateway keeps the state; the backend's own stored item by id otherwise.
        kinds = [i.get('type') for i in body['input']]
        turns = [n for n, k in enumerate(kinds) if k == 'function_call']
        assert all(kinds[n - 1] == 'reasoning' for n in turns), kinds
        assert backend == 'Responses' or all(body['input'][n - 1]['encrypted_content'] for n in turns), kinds
    else:
        return      # no provider items to carry (Chat, plain Claude)
    assert len(turns) == tool_turns


def check_clean(gw, backend: str, tool_turns: int) -> None:
    """No replay the backend refused, and the last request's ``tool_turns`` turns kept their items."""
    assert gw.fake.violations == []
    check_provider_items(gw, backend, tool_turns)
