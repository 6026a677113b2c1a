"""Conversation memory evaluation: does a stateful template really carry the conversation?

Holds a three-turn chat through a template connection and checks what was
sent and what came back::

    turn 1  a code word to remember     the body has no previous_response_id
    turn 2  an unrelated question       previous_response_id = turn 1's response, only the new message
    turn 3  "which code word?"          previous_response_id = turn 2's response, only the new message,
                                        and the reply names the code word (recall of turn 1)

Run ``python -m llmconn.testing.template_eval`` to check the shipped OpenAI
Responses templates against the fake provider (started in this process), or
``--config etc/llm.yaml --name "NAME"`` to check a configured connection
against its real endpoint. The third question starts with ``recall:``, which
makes the fake repeat the first user message; a real model simply answers it.
Exits 0 when every check passed.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmconn.testing.fake_common import RECALL_PREFIX

ROOT = Path(__file__).resolve().parent.parent.parent
TEMPLATES = ROOT / 'etc' / 'templates'
ADAPTER = 'openai-responses'
MODEL = 'gpt-5-mini'
STATE_FIELD = 'previous_response_id'


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str = ''

    def __str__(self) -> str:
        return f'{"PASS" if self.passed else "FAIL"}  {self.name}' + (f'  ({self.detail})' if self.detail else '')


def questions(word: str) -> list[str]:
    return [f'Please remember the code word {word}.', 'What is 2 + 3?',
            f'{RECALL_PREFIX} which code word did I ask you to remember in my first message?']


def record_bodies(conn) -> list:
    """Every body the connection sends from now on, in order (its transport is wrapped)."""
    sent: list = []
    exchange = conn.transport.exchange

    def recording(method: str, url: str, headers: dict, body: Any):
        sent.append(body)
        return exchange(method, url, headers, body)

    conn.transport.exchange = recording
    return sent


def evaluate(conn, chat_id: str = '') -> list[Check]:
    """Run the three turns on ``conn`` (a fresh chat unless ``chat_id``) and return the checks."""
    from llmconn.errors import InvalidInput
    if not conn.provider.raw_answers:
        raise InvalidInput(f'{conn.name} is provider {conn.conf.provider}; the memory evaluation is for '
                           f'provider: template connections')
    chat_id = chat_id or f'memory-eval-{secrets.token_hex(6)}'
    word = f'lark-{secrets.token_hex(3)}'
    sent = record_bodies(conn)
    replies = [conn.chat(text, chat_id=chat_id) for text in questions(word)]
    try:
        history = conn.history(chat_id)
    finally:
        conn.delete_history(chat_id)
    checks = [Check('turn 1 starts a new conversation', STATE_FIELD not in _dict(sent[0]),
                    f'{STATE_FIELD}={_dict(sent[0]).get(STATE_FIELD)!r}')]
    for turn in (2, 3):
        checks.append(_continues(turn, sent[turn - 1], replies[turn - 2], questions(word)[turn - 1]))
    checks.append(Check('turn 3 recalls turn 1', word in replies[2]['text'], replies[2]['text'][:200]))
    checks.append(Check('history holds the three turns', len(history) == 6 and history[4]['content'] == questions(word)[2],
                        f'{len(history)} messages'))
    return checks


def _continues(turn: int, body: Any, previous_reply: dict, text: str) -> Check:
    previous_id = _dict(previous_reply.get('raw')).get('id')
    body = _dict(body)
    sent_id, items = body.get(STATE_FIELD), body.get('input')
    ok = bool(previous_id) and sent_id == previous_id and items == [{'role': 'user', 'content': text}]
    return Check(f'turn {turn} continues turn {turn - 1} with only the new message', ok,
                 f'{STATE_FIELD}={sent_id!r}, expected {previous_id!r}; {len(items or ())} input item(s)')


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def against_fake(templates: Path = TEMPLATES, adapter: str = ADAPTER) -> list[Check]:
    """The evaluation of ``templates/<adapter>.*.j2`` against a fake provider in this process."""
    from llmconn.registry import Registry
    from llmconn.testing.fake_server import FakeProviderServer

    with FakeProviderServer() as fake:
        registry = Registry.from_dict({'llm': [{
            'name': 'memory-eval', 'provider': 'template', 'model': MODEL, 'max_retries': 0,
            'address': f'{fake.url}/v1/responses',
            'request_template_file': f'{adapter}.request.j2', 'response_template_file': f'{adapter}.response.j2',
        }]}, base_dir=templates)
        try:
            return evaluate(registry['memory-eval'])
        finally:
            registry.close()


def against_config(config: str, name: str) -> list[Check]:
    from llmconn.registry import Registry

    registry = Registry.from_file(config)
    try:
        return evaluate(registry[name])
    finally:
        registry.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog='python -m llmconn.testing.template_eval', description=__doc__.split('\n')[0])
    parser.add_argument('--config', help='a configuration file; with --name, evaluates that connection')
    parser.add_argument('--name', help='the template connection to evaluate')
    parser.add_argument('--templates', type=Path, default=TEMPLATES, help='without --config: the template directory')
    parser.add_argument('--adapter', default=ADAPTER, help='without --config: <adapter>.request.j2 and .response.j2')
    args = parser.parse_args(argv)
    if bool(args.config) != bool(args.name):
        parser.error('give --config and --name together')
    from llmconn.errors import LLMConnError
    try:
        checks = against_config(args.config, args.name) if args.config else against_fake(args.templates, args.adapter)
    except LLMConnError as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    for check in checks:
        print(check)
    return 0 if all(c.passed for c in checks) else 1


if __name__ == '__main__':
    sys.exit(main())
