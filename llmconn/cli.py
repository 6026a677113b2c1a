"""The ``llmconn`` command: check a configuration, call a connection, serve services.

Subcommands that need heavier modules (the HTTP host, the fake provider)
import them only when chosen, so ``llmconn check`` stays quick and never
monkey-patches anything.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from llmconn.errors import LLMConnError
from llmconn.redact import mask_url

DEFAULT_CONFIG = 'etc/llm.yaml'


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if getattr(args, 'verbose', False) else logging.WARNING,
                        format='%(asctime)s %(levelname)s %(name)s: %(message)s')
    try:
        return args.func(args)
    except LLMConnError as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='llmconn', description='LLM connections for Zato-style services')
    parser.add_argument('-v', '--verbose', action='store_true', help='log at INFO level')
    sub = parser.add_subparsers(dest='command', required=True)

    check = sub.add_parser('check', help='validate a configuration file and list its connections')
    check.add_argument('config', nargs='?', default=DEFAULT_CONFIG)
    check.set_defaults(func=cmd_check)

    for name, func, helptext in (('invoke', cmd_invoke, 'one-shot call to a connection'),
                                 ('chat', cmd_chat, 'one chat call, continuing --chat-id')):
        p = sub.add_parser(name, help=helptext)
        p.add_argument('name', help='connection name')
        p.add_argument('text', help='the user message')
        p.add_argument('--config', default=DEFAULT_CONFIG)
        p.add_argument('--skill', default='')
        p.add_argument('--json', action='store_true', help='print the whole result as JSON')
        if name == 'chat':
            p.add_argument('--chat-id', required=True)
        p.set_defaults(func=func)

    ping = sub.add_parser('ping', help='check that a connection\'s provider answers')
    ping.add_argument('name')
    ping.add_argument('--config', default=DEFAULT_CONFIG)
    ping.set_defaults(func=cmd_ping)

    serve = sub.add_parser('serve', help='run the service host')
    from llmconn.server import add_serve_arguments
    add_serve_arguments(serve)
    serve.set_defaults(func=cmd_serve)

    fake = sub.add_parser('fake-provider',
                          help='run the fake provider (Claude, OpenAI, Responses and Gemini wire formats); '
                               'LLMCONN_FAKE_API_KEY makes it require that key')
    fake.add_argument('--host', default='127.0.0.1')
    fake.add_argument('--port', type=int, default=17011)
    fake.add_argument('--latency', type=float, default=0.0, help='seconds added to every answer')
    fake.set_defaults(func=cmd_fake_provider)
    return parser


def cmd_check(args) -> int:
    from llmconn import config as mod_config
    conf = mod_config.load_file(args.config)
    print(f'{args.config}: OK, {len(conf.llm)} connection(s), store {mask_url(conf.redis.url)}, '
          f'skills in {conf.skills_path}')
    for conn in conf.llm:
        state = '' if conn.is_active else '  (inactive)'
        secret = 'secret set' if conn.secret_value else 'no secret'
        print(f'  {conn.name}: provider={conn.provider} model={conn.model} address={mask_url(conn.address)} '
              f'[{secret}]{state}')
    return 0


def cmd_invoke(args) -> int:
    return _call(args, lambda conn: conn.invoke(args.text, skill=args.skill))


def cmd_chat(args) -> int:
    return _call(args, lambda conn: conn.chat(args.text, chat_id=args.chat_id, skill=args.skill))


def _call(args, call) -> int:
    from llmconn.registry import Registry
    registry = Registry.from_file(args.config)
    try:
        result = call(registry[args.name])
    finally:
        registry.close()
    print(json.dumps(result, indent=2, ensure_ascii=False) if args.json else result['text'])
    return 0


def cmd_ping(args) -> int:
    from llmconn.registry import Registry
    registry = Registry.from_file(args.config)
    try:
        registry[args.name].ping()
    finally:
        registry.close()
    print(f'{args.name}: OK')
    return 0


def cmd_serve(args) -> int:
    from llmconn.server import run_serve
    return run_serve(args)


def cmd_fake_provider(args) -> int:
    from llmconn.testing.fake_server import main as fake_main
    return fake_main(['--host', args.host, '--port', str(args.port), '--latency', str(args.latency)]) or 0
