"""Sealed reasoning across gateway processes when Redis restarts empty: every process agrees on one secret.

Two ``llmconn serve`` processes share a Redis. An item sealed by one is
opened by the other; after the Redis restarts empty (the signing secret
gone with it), whichever process seals first stores the secret again, and
both use it from then on: no process keeps signing with a secret of its own.
"""

import pytest

from gateway_stack import ASK, ORDER_TOOL, GatewayStack, create

INCLUDE = ['reasoning.encrypted_content']


@pytest.fixture
def gw():
    """A stack of its own per test: what each process has seen of the secret is part of the scenario."""
    stack = GatewayStack(processes=2)
    yield stack
    stack.close()


def sealed_turn(gw, process: int):
    first = create(gw.client(process=process), model='Claude', input=ASK, tools=[ORDER_TOOL], store=False,
                   include=INCLUDE)
    assert any(i.type == 'reasoning' and i.encrypted_content for i in first.output)
    return first


def continued(gw, first, process: int) -> str:
    """The answer to ``first``'s call, sent back to ``process`` with the sealed reasoning item."""
    call = next(i for i in first.output if i.type == 'function_call')
    items = [{'role': 'user', 'content': ASK}] + [i.model_dump(exclude_none=True) for i in first.output] + [
        {'type': 'function_call_output', 'call_id': call.call_id, 'output': 'shipped'}]
    return create(gw.client(process=process), model='Claude', input=items, tools=[ORDER_TOOL], store=False,
                  include=INCLUDE).output_text


def restart_redis_empty(gw) -> None:
    gw.redis_server.stop()
    gw.redis_server.start()
    assert gw.redis.dbsize() == 0


def test_every_process_opens_what_another_sealed_after_redis_restarts_empty(gw):
    sealed_turn(gw, 0)                  # process 0 knows the first secret, process 1 none
    restart_redis_empty(gw)
    after = sealed_turn(gw, 1)          # process 1 is first to need a secret again: a new one
    assert continued(gw, after, 0) == 'tool said: shipped'
    assert continued(gw, after, 1) == 'tool said: shipped'
    mine = sealed_turn(gw, 0)
    assert continued(gw, mine, 1) == 'tool said: shipped'


def test_the_first_process_after_a_restart_brings_the_old_secret_back(gw):
    before = sealed_turn(gw, 0)
    assert continued(gw, before, 1) == 'tool said: shipped'
    restart_redis_empty(gw)
    again = sealed_turn(gw, 0)          # process 0 stores the secret it knew
    for process in (0, 1):
        assert continued(gw, before, process) == 'tool said: shipped'
        assert continued(gw, again, process) == 'tool said: shipped'
    assert gw.fake.violations == []
