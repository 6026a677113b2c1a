"""Shared pieces of the tool tests: one connection per provider against the fake server."""

from __future__ import annotations

ADDRESS = {'claude': '', 'openai': '/v1', 'openai-responses': '/v1', 'gemini': '/v1beta'}
MODEL = {'claude': 'claude-sonnet-5-5', 'openai': 'gpt-4o-mini', 'openai-responses': 'gpt-5',
         'gemini': 'gemini-2.5-flash'}
PROVIDERS = tuple(ADDRESS)


def connection_config(redis_url: str, provider_url: str, name: str, kind: str, **conn) -> dict:
    entry = {'name': name, 'provider': kind, 'model': MODEL[kind], 'address': provider_url + ADDRESS[kind],
             'max_retries': 0, **conn}
    return {'redis': {'url': redis_url}, 'llm': [entry]}


ORDERS = {'123': 'shipped', '456': 'lost'}


def get_order(order_id: str) -> str:
    """Look up an order by its id."""
    return ORDERS[order_id]


def add(a: int, b: int = 1) -> int:
    """Add two numbers."""
    return a + b
