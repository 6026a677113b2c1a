"""Simon Willison's ``llm`` against ``llmconn serve``: its OpenAI-compatible models, as a library and as its CLI.

Configured as its users configure a server of their own: an
``extra-openai-models.yaml`` in ``LLM_USER_PATH`` naming the gateway as
``api_base``, one Chat Completions model and one Responses model
(``responses: true``) per backend. ``llm`` replays a conversation itself:
the earlier turns' tool calls and outputs go back from its own records
(``conversation.chain`` in memory, ``llm -c`` from its logs database). Its
Responses model always sends ``store: false``, so what a replay needs
comes back sealed in the reasoning items: it asks for
``include: ["reasoning.encrypted_content"]`` when the model is configured
with ``reasoning: true`` and a reasoning option is given (here
``reasoning_summary``), which the gateway must accept on every backend
that can show a summary.
"""

import os
import subprocess
import sys

import llm
import openai
import pytest
import yaml

from agent_backends import (ANSWER, ANSWER_AGAIN, ANSWER_THIRD, ASK, ASK_AGAIN, ASK_THIRD, BACKENDS, PLAIN,
                            check_clean, gateway, order)
from gateway_stack import KEYS

ROUTES = ['chat', 'responses']
SECRET = KEYS['a'][0]
# The tool as the CLI takes it (--functions): Python source.
FUNCTIONS = '''
def get_order(order_id: str) -> str:
    """Look an order up."""
    return f"order {order_id} shipped"
'''


def get_order(order_id: str) -> str:
    """Look an order up."""
    return order(order_id)


def model_id(backend: str, route: str) -> str:
    return f'gw-{route}-{backend}'


@pytest.fixture(scope='module')
def gw(tmp_path_factory):
    user = tmp_path_factory.mktemp('llm-user')
    stack = gateway()
    models = [{'model_id': model_id(b, route), 'model_name': b, 'api_base': stack.url(), 'api_key_name': 'gateway',
               'supports_tools': True,
               **({'responses': True} if route == 'responses' else {}),
               **({'reasoning': True} if options(b, route) else {})}
              for b in BACKENDS for route in ROUTES]
    # As most users first write it: a Responses model with no reasoning option (so no include).
    models.append({'model_id': 'gw-bare-Claude', 'model_name': 'Claude', 'api_base': stack.url(),
                   'api_key_name': 'gateway', 'supports_tools': True, 'responses': True})
    (user / 'extra-openai-models.yaml').write_text(yaml.safe_dump(models))
    before = os.environ.get('LLM_USER_PATH')
    os.environ['LLM_USER_PATH'] = str(user)
    yield stack
    if before is None:
        del os.environ['LLM_USER_PATH']
    else:
        os.environ['LLM_USER_PATH'] = before
    stack.close()


def options(backend: str, route: str) -> dict:
    """The reasoning options of a model (configured ``reasoning: true`` when it has some).

    On Responses a summary, so that ``llm`` asks for sealed reasoning, except of a Chat backend (Chat
    Completions returns no summary, and has no provider items to carry); on Chat Completions, a Responses
    backend reasons when asked to (reasoning_effort), Claude's and Gemini's thinking is their connection's.
    """
    if route == 'responses':
        return {'reasoning_summary': 'auto'} if backend != 'Chat' else {}
    return {'reasoning_effort': 'low'} if backend.startswith('Responses') else {}


def conversation(backend: str, route: str):
    return llm.get_model(model_id(backend, route)).conversation(tools=[get_order])


def say(conv, backend: str, route: str, text: str, stream: bool = False):
    return conv.chain(text, key=SECRET, options=options(backend, route), stream=stream)


@pytest.mark.parametrize('route', ROUTES)
@pytest.mark.parametrize('backend', BACKENDS)
def test_a_plain_answer(gw, backend, route):
    response = llm.get_model(model_id(backend, route)).prompt(PLAIN, key=SECRET, **options(backend, route))
    assert response.text() == 'echo: hello there | users: 1 | previous: - | system: no'


@pytest.mark.parametrize('route', ROUTES)
@pytest.mark.parametrize('backend', BACKENDS)
def test_a_tool_round_trip(gw, backend, route):
    gw.fake.clear()
    assert say(conversation(backend, route), backend, route, ASK).text() == ANSWER
    check_clean(gw, backend, 1)


@pytest.mark.parametrize('route', ROUTES)
@pytest.mark.parametrize('backend', BACKENDS)
def test_a_conversation_replays_its_earlier_tool_turn(gw, backend, route):
    conv = conversation(backend, route)
    say(conv, backend, route, ASK).text()
    gw.fake.clear()
    assert say(conv, backend, route, ASK_AGAIN).text() == ANSWER_AGAIN
    check_clean(gw, backend, 2)


@pytest.mark.parametrize('route', ROUTES)
@pytest.mark.parametrize('backend', BACKENDS)
def test_a_streamed_tool_turn_after_another(gw, backend, route):
    conv = conversation(backend, route)
    say(conv, backend, route, ASK).text()
    gw.fake.clear()
    chunks = list(say(conv, backend, route, ASK_THIRD, stream=True))
    assert ''.join(chunks) == ANSWER_THIRD and len(chunks) > 1
    check_clean(gw, backend, 2)
    assert all(r['body'].get('stream') or r['path'].endswith(':streamGenerateContent') for r in gw.fake.requests)


def cli(gw, *args: str) -> str:
    """``llm`` run as its users run it, with its logs database in the module's LLM_USER_PATH."""
    done = subprocess.run([sys.executable, '-m', 'llm', *args, '--key', SECRET], capture_output=True, text=True,
                          timeout=60, env={**os.environ})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


# Each run starts a Python with llm's plugins: one per route, on the backends whose items a replay needs most.
@pytest.mark.parametrize('backend, route', [('Claude', 'responses'), ('GeminiThinking', 'chat')])
def test_the_cli_continues_a_conversation_from_its_logs(gw, backend, route):
    """``llm -c`` rebuilds the conversation from logs.db: the first tool turn goes back with its items."""
    opts = [x for k, v in options(backend, route).items() for x in ('-o', k, v)]
    assert cli(gw, '-m', model_id(backend, route), '--functions', FUNCTIONS, *opts, ASK) == ANSWER
    gw.fake.clear()
    assert cli(gw, '-c', '--functions', FUNCTIONS, *opts, ASK_AGAIN) == ANSWER_AGAIN
    check_clean(gw, backend, 2)


def test_without_include_claude_with_thinking_refuses_the_call_before_dispatch_saying_what_to_do(gw):
    """store: false and no include keeps nothing anywhere: the calls would go back without their thinking."""
    conv = llm.get_model('gw-bare-Claude').conversation(tools=[get_order])
    gw.fake.clear()
    with pytest.raises(openai.BadRequestError) as refused:
        conv.chain(ASK, key=SECRET).text()
    assert refused.value.body['code'] == 'reasoning_required' and 'include' in refused.value.message
    assert len(gw.fake.requests) == 1       # the first call only: the continuation never reached Claude
