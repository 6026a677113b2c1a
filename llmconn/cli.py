"""The ``llmconn`` command: check a configuration, call a connection, serve services.

Subcommands that need heavier modules (the HTTP host, the fake provider)
import them only when chosen, so ``llmconn check`` stays quick and never
monkey-patches anything; ``llmconn serve`` patches (gevent) before anything
imports ``requests`` or ``redis`` (see :mod:`llmconn.server`).

A subcommand is one ``add_*(sub, common)`` function in :data:`SUBCOMMANDS`:
it adds its parser with ``parents=common`` (so ``-v`` works after the
subcommand too) and sets ``func``. Another module adds one by appending its
own function to that list.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Callable

from llmconn import __version__
from llmconn.cli_admin import add_admin_commands, as_json, check_connect, shown
from llmconn.errors import LLMConnError
from llmconn.redact import mask_url

DEFAULT_CONFIG = 'etc/llm.yaml'
CONFIG_HELP = f'the YAML configuration file (default {DEFAULT_CONFIG})'


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if getattr(args, 'verbose', False) else logging.WARNING,
                        format='%(asctime)s %(levelname)s %(name)s: %(message)s')
    try:
        code = args.func(args)
        sys.stdout.flush()          # here, where a closed pipe is caught, not at exit
        return code
    except LLMConnError as e:
        print(shown(f'error: {e}', sys.stderr, one_line=True), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _closed_pipe()


def _closed_pipe() -> int:
    """The reader of our output went away (``llmconn ... | head``): exit quietly, as Unix tools do."""
    # Python would flush stdout again at exit and print a second BrokenPipeError: point it at devnull.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141      # 128 + SIGPIPE, what a shell reports for a tool killed by the closed pipe


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='llmconn', description='LLM connections for Zato-style services')
    parser.add_argument('-v', '--verbose', action='store_true', help='log at INFO level')
    parser.add_argument('--version', action='version', version=f'llmconn {__version__}')
    # The same flag after the subcommand; SUPPRESS keeps it from resetting a -v given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument('-v', '--verbose', action='store_true', default=argparse.SUPPRESS,
                        help='log at INFO level')
    sub = parser.add_subparsers(dest='command', required=True, metavar='COMMAND')
    for add in SUBCOMMANDS:
        add(sub, [common])
    return parser


def add_check(sub, common: list) -> None:
    check = sub.add_parser('check', parents=common, help='validate a configuration file and list its connections')
    check.add_argument('config', nargs='?', default=None, help=CONFIG_HELP)
    check.add_argument('--config', dest='config_flag', default=None, help='the same, as a flag')
    check.add_argument('--connect', action='store_true', help='also reach the store and ping each active provider')
    check.set_defaults(func=cmd_check)


def add_calls(sub, common: list) -> None:
    # chat (a conversation, or one message) is in llmconn/cli_admin.py
    for name, func, helptext in (('invoke', cmd_invoke, 'one-shot call to a connection'),):
        p = sub.add_parser(name, parents=common, help=helptext)
        p.add_argument('name', help='the connection name, as in the configuration (llmconn check lists them)')
        p.add_argument('text', help='the user message')
        p.add_argument('--config', default=DEFAULT_CONFIG, help=CONFIG_HELP)
        p.add_argument('--skill', default='', help='a skill from skills_dir to use as the system prompt')
        p.add_argument('--json', action='store_true', help='print the whole result as JSON')
        p.set_defaults(func=func)


def add_ping(sub, common: list) -> None:
    ping = sub.add_parser('ping', parents=common, help='check that a connection\'s provider answers')
    ping.add_argument('name', help='the connection name, as in the configuration')
    ping.add_argument('--config', default=DEFAULT_CONFIG, help=CONFIG_HELP)
    ping.set_defaults(func=cmd_ping)


def add_serve(sub, common: list) -> None:
    serve = sub.add_parser('serve', parents=common, help='run the service host')
    from llmconn.server import add_serve_arguments      # light: the server imports nothing heavy at the top
    add_serve_arguments(serve)
    serve.set_defaults(func=cmd_serve)


def add_fake_provider(sub, common: list) -> None:
    fake = sub.add_parser('fake-provider', parents=common,
                          help='run the fake provider (Claude, OpenAI, Responses and Gemini wire formats); '
                               'LLMCONN_FAKE_API_KEY makes it require that key')
    fake.add_argument('--host', default='127.0.0.1', help='address to listen on (default 127.0.0.1)')
    fake.add_argument('--port', type=int, default=17011, help='port to listen on (default 17011)')
    fake.add_argument('--latency', type=float, default=0.0, help='seconds added to every answer')
    fake.set_defaults(func=cmd_fake_provider)


# The subcommands, in the order --help lists them; append to add one.
SUBCOMMANDS: list[Callable] = [add_check, add_calls, add_admin_commands, add_ping, add_serve, add_fake_provider]


def cmd_check(args) -> int:
    from llmconn import config as mod_config
    args.config = args.config_flag or args.config or DEFAULT_CONFIG
    conf = mod_config.load_file(args.config)
    print(f'{args.config}: OK, {len(conf.llm)} connection(s), store {mask_url(conf.redis.url)}, '
          f'skills in {conf.skills_path}')
    for conn in conf.llm:
        state = '' if conn.is_active else '  (inactive)'
        secret = 'secret set' if conn.secret_value else 'no secret'
        fallbacks = f' fallbacks={", ".join(conn.fallbacks)}' if conn.fallbacks else ''
        print(f'  {conn.name}: provider={conn.provider} model={conn.model} address={mask_url(conn.address)}'
              f'{fallbacks} [{secret}]{state}')
    if args.connect:
        return check_connect(args.config)
    return 0


def cmd_invoke(args) -> int:
    return _call(args, lambda conn: conn.invoke(args.text, skill=args.skill))


def _call(args, call) -> int:
    from llmconn.registry import Registry
    registry = Registry.from_file(args.config)
    try:
        result = call(registry[args.name])
    finally:
        registry.close()
    print(as_json(result) if args.json else shown(result['text'], sys.stdout))
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
