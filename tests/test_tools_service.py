"""The demo tool service runs its loop unchanged on every provider, configured only in YAML."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from llmconn.service import run
from tests.tools_helpers import PROVIDERS, connection_config

DEMO = Path(__file__).resolve().parent.parent / 'services' / 'demo_tools.py'


def load_demo():
    spec = importlib.util.spec_from_file_location('demo_tools', DEMO)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize('kind', PROVIDERS)
def test_the_demo_order_service_calls_its_tool_on_every_provider(redis_url, provider, unique, open_registry, kind):
    registry = open_registry(connection_config(redis_url, provider.url, 'Support', kind))
    demo = load_demo()
    service = demo.OrderStatus(registry)
    payload = run(service, {'user_id': unique, 'text': 'call get_order {"order_id": "123"}'}).payload
    assert payload == {'reply': 'tool said: shipped on Monday', 'rounds': 2, 'tool_calls': [
        {'name': 'get_order', 'arguments': {'order_id': '123'}, 'output': 'shipped on Monday', 'is_error': False}]}
    missing = run(demo.OrderStatus(registry), {'user_id': unique, 'text': 'call get_order {"order_id": "9"}'}).payload
    assert missing['tool_calls'][0]['is_error'] and 'there is no order 9' in missing['reply']
    assert provider.violations == []
