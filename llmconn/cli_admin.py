"""The operator's subcommands of ``llmconn``: usage, history, forget, chats, chat (a REPL), check --connect.

Registered by :func:`add_admin_commands` from :mod:`llmconn.cli`; like it,
this module imports nothing heavy at the top (``llmconn serve`` must patch
gevent before ``redis`` and ``requests`` load). Each one
reads ``--config`` (default ``etc/llm.yaml``) and opens its own registry,
closed again before returning, so counts it made are written to the ledger.

``llmconn chat NAME`` is a conversation: on a terminal a prompt and the
answer streamed as it comes; with stdin not a terminal each line read is one
message and each answer is printed whole on stdout, so it scripts.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
from typing import Any, Callable, TextIO

from llmconn.errors import ChatBusy, LLMConnError, StoreError

DEFAULT_CONFIG = 'etc/llm.yaml'
# Control characters but newline and tab: chat text shown on a terminal must not drive it (ESC
# sequences, OSC titles, 8-bit CSI), nor be disguised by the marks that reorder text (bidi).
_CONTROL = {c: f'\\x{c:02x}' for c in (*range(0x00, 0x09), *range(0x0b, 0x20), 0x7f)}
_CONTROL.update({c: f'\\x{c:02x}' for c in range(0x80, 0xa0)})
_BIDI = (0x061c, 0x200e, 0x200f, *range(0x202a, 0x202f), *range(0x2066, 0x206a))
_CONTROL.update({c: f'\\u{c:04x}' for c in _BIDI})
# A value that must stay on one line (a chat id in a listing, an error): newline and tab too.
_CONTROL_ONE_LINE = {**_CONTROL, 0x09: '\\t', 0x0a: '\\n'}
# JSON escapes what json.dumps(ensure_ascii=False) leaves raw: DEL, C1 controls, bidi marks, and lone
# surrogates (which no UTF-8 stdout can write). The JSON means the same; a terminal shows it inert.
_JSON_ESCAPES = {c: f'\\u{c:04x}' for c in (0x7f, *range(0x80, 0xa0), *_BIDI, *range(0xd800, 0xe000))}
PROMPT = 'you> '
SCAN_COUNT = 1000
QUIT_COMMANDS = ('/quit', '/exit')


def add_admin_commands(sub: Any, common: list) -> None:
    """Add the operator's subcommands to the ``llmconn`` parser's subparsers (see ``cli.SUBCOMMANDS``)."""
    def command(name: str, func: Callable, helptext: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=common, help=helptext, description=helptext)
        p.add_argument('--config', default=DEFAULT_CONFIG, help=f'the YAML configuration (default {DEFAULT_CONFIG})')
        p.set_defaults(func=func)
        return p

    p = command('usage', cmd_usage, 'calls, errors and tokens per connection, model and UTC day')
    p.add_argument('--since', default='', help='first day to show, YYYY-MM-DD (UTC); default: all kept')
    p.add_argument('--connection', default='', help='only this connection')
    p.add_argument('--json', action='store_true', help='print the rows as JSON')

    p = command('history', cmd_history, 'print the stored turns of a chat, oldest first')
    p.add_argument('name', help='connection name')
    p.add_argument('chat_id', help='the chat id, as the service passed it')
    p.add_argument('--json', action='store_true', help='print the messages as JSON')

    p = command('forget', cmd_forget, 'delete the stored turns of a chat')
    p.add_argument('name', help='connection name')
    p.add_argument('chat_id', help='the chat id, as the service passed it')

    p = command('chats', cmd_chats, 'list the chat ids a connection has stored turns for')
    p.add_argument('name', help='connection name')
    p.add_argument('--match', default='*', help='only chat ids matching this shell-style glob, e.g. "user-*" '
                                                '(* ? [seq]; match a literal * or [ as [*] or [[])')
    p.add_argument('--json', action='store_true', help='print the ids as a JSON list')

    p = command('chat', cmd_chat, 'talk to a connection: a conversation, or one message with TEXT')
    p.add_argument('name', help='connection name')
    p.add_argument('text', nargs='?', help='send just this message and print the answer')
    p.add_argument('--chat-id', default='', help='the conversation to continue (default: a new one)')
    p.add_argument('--skill', default='', help='a skill from skills_dir to use as the system prompt')
    p.add_argument('--json', action='store_true', help='with TEXT: print the whole result as JSON')


def _registry(args):
    from llmconn.registry import Registry
    return Registry.from_file(args.config)


def _note_one_process(registry, args) -> None:
    """A memory:// store is this command's own: say that a server's chats are out of its sight."""
    if not registry.store.shared:
        print(f'note: {args.config} stores chats in {registry.store.url_for_display}, inside each process, so '
              f'this command sees only its own, never those of a running llmconn serve; to reach them, set '
              f'redis.url (REDIS_URL) to the Redis the server uses', file=sys.stderr)


# -- usage, history, forget, chats ----------------------------------------------------------------

def cmd_usage(args) -> int:
    from llmconn.usage_report import format_table, parse_day, read_usage
    since = parse_day(args.since) if args.since else ''
    registry = _registry(args)
    try:
        rows = read_usage(registry.store, since=since, connection=args.connection)
        if args.connection and not rows and args.connection not in registry:
            registry[args.connection]       # a name neither configured nor counted: say which ones exist
        from llmconn.gateway.limits import format_report, report
        limited = [] if args.json else report(registry)
    finally:
        registry.close()
    if not registry.store.shared:
        print(f'note: the store is {registry.store.url_for_display} (one process only), so it holds no usage '
              f'of other processes', file=sys.stderr)
    print(as_json(rows) if args.json else shown(format_table(rows), sys.stdout))
    if limited:
        print('\n' + shown(format_report(limited), sys.stdout))
    return 0


def cmd_history(args) -> int:
    registry = _registry(args)
    try:
        _note_one_process(registry, args)
        messages = registry[args.name].history(args.chat_id)
    finally:
        registry.close()
    if args.json:
        print(as_json(messages))
    elif not messages:
        print(f'no stored turns for chat {args.chat_id!r} of {args.name!r}', file=sys.stderr)
    else:
        for message in messages:
            print(shown(f'{message["role"]}: {message["content"]}', sys.stdout))
    return 0


def cmd_forget(args) -> int:
    registry = _registry(args)
    try:
        _note_one_process(registry, args)
        conn = registry[args.name]
        had = conn.history(args.chat_id)
        conn.delete_history(args.chat_id)       # whatever the read found: a turn saved meanwhile goes too
    finally:
        registry.close()
    if had:
        print(f'forgot chat {args.chat_id!r} of {args.name!r} ({len(had)} messages)')
    else:
        print(f'chat {args.chat_id!r} of {args.name!r} had no stored turns; nothing to forget')
    return 0


def cmd_chats(args) -> int:
    registry = _registry(args)
    try:
        _note_one_process(registry, args)
        registry[args.name]
        ids = list_chats(registry.store, args.name, args.match)
    finally:
        registry.close()
    print(as_json(ids, indent=None) if args.json else '\n'.join(shown(i, sys.stdout, one_line=True) for i in ids))
    return 0


def list_chats(store: Any, conn_name: str, match: str = '*') -> list[str]:
    """The ids of every chat of ``conn_name`` with stored turns, sorted; SCAN, every master of a cluster."""
    from llmconn.store.keys import KEY_PREFIX, encode
    from llmconn.usage_report import decode

    head = f'{KEY_PREFIX}:{{{encode(conn_name)}:'
    tail = '}:turns'
    ids = []
    for key in store.scan(head + '*' + tail, SCAN_COUNT):
        chat_id = decode(key.decode()[len(head):-len(tail)])
        if fnmatch.fnmatchcase(chat_id, match):
            ids.append(chat_id)
    return sorted(ids)


# -- check --connect ---------------------------------------------------------------------------

def check_connect(path: str) -> int:
    """Reach the store and ping every active connection; 1 when any of them fails."""
    from llmconn.registry import Registry
    registry = Registry.from_file(path)
    failed = 0
    try:
        try:
            registry.store.ping()
            print(f'  store {registry.store.url_for_display}: OK')
        except StoreError as e:
            failed += 1
            print(shown(f'  store: FAILED: {e}', sys.stdout, one_line=True))
        for name in registry:
            conn = registry[name]
            if not conn.conf.is_active:
                print(f'  {name}: skipped (inactive)')
                continue
            try:
                conn.ping()
                print(f'  {name}: OK')
            except LLMConnError as e:
                failed += 1
                print(shown(f'  {name}: FAILED: {e}', sys.stdout, one_line=True))
    finally:
        registry.close()
    if failed:
        print(f'error: {failed} check(s) failed', file=sys.stderr)
    return 1 if failed else 0


# -- chat --------------------------------------------------------------------------------------

def cmd_chat(args) -> int:
    registry = _registry(args)
    try:
        conn = registry[args.name]
        chat_id = args.chat_id or f'cli-{os.urandom(4).hex()}'
        if args.text is not None:
            result = conn.chat(args.text, chat_id=chat_id, skill=args.skill)
            print(as_json(result) if args.json else shown(result['text'], sys.stdout))
            if not args.chat_id:
                print(f'chat id: {chat_id} (continue with --chat-id {chat_id})', file=sys.stderr)
            return 0
        return Conversation(conn, chat_id, args.skill, sys.stdin, sys.stdout, sys.stderr).run()
    finally:
        registry.close()


class Conversation:
    """The REPL of ``llmconn chat``: one message per line, the answer streamed on a terminal."""

    def __init__(self, conn: Any, chat_id: str, skill: str, stdin: TextIO, stdout: TextIO, stderr: TextIO) -> None:
        self.conn, self.chat_id, self.skill = conn, chat_id, skill
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.interactive = stdin.isatty()
        self.failed = False

    def run(self) -> int:
        if self.interactive:
            _enable_line_editing()
            print(f'Chatting with {self.conn.name} ({self.conn.conf.model}), chat id '
                  f'{shown(self.chat_id, self.stdout, one_line=True)}.\n'
                  f'Type a message and press Enter. /history shows the chat, /quit or Ctrl-D leaves.',
                  file=self.stdout, flush=True)
        else:
            print(f'chat id: {shown(self.chat_id, self.stderr, one_line=True)}', file=self.stderr, flush=True)
        while True:
            line = self._read()
            if line is None:
                break
            text = line.strip()
            if not text:
                continue
            if self.interactive and text in QUIT_COMMANDS:
                break
            if self.interactive and text == '/history':
                for message in self.conn.history(self.chat_id):
                    print(shown(f'{message["role"]}: {message["content"]}', self.stdout), file=self.stdout)
                continue
            self._turn(text)
        # A script learns that a line failed; a person who saw the error and left did not fail.
        return 1 if self.failed and not self.interactive else 0

    def _read(self) -> str | None:
        if not self.interactive:
            line = self.stdin.readline()
            return line if line else None
        try:
            return input(PROMPT)
        except EOFError:
            print(file=self.stdout)
            return None

    def _turn(self, text: str) -> None:
        from llmconn.providers.base import STREAM
        try:
            if self.interactive and STREAM in self.conn.provider.capabilities:
                self._streamed(text)
            else:
                print(shown(self.conn.chat(text, chat_id=self.chat_id, skill=self.skill)['text'], self.stdout),
                      file=self.stdout, flush=True)
        except KeyboardInterrupt:
            print('\n(interrupted: this answer was not saved)', file=self.stdout, flush=True)
        except (ChatBusy, LLMConnError) as e:
            self.failed = True
            print(shown(f'error: {e}', self.stderr, one_line=True), file=self.stderr, flush=True)

    def _streamed(self, text: str) -> None:
        out = self.stdout
        out.write(f'{self.conn.name}> ')
        events = self.conn.stream(text, chat_id=self.chat_id, skill=self.skill)
        try:
            for event in events:
                if event.type == 'text':
                    out.write(shown(event.text, out))
                    out.flush()
        finally:
            events.close()
            out.write('\n')
            out.flush()


def shown(text: str, stream: TextIO, one_line: bool = False) -> str:
    """``text`` for a human: on a terminal its control characters (ESC...) are written out as ``\\xNN``,
    and with ``one_line`` its line breaks too (a chat id with a newline must not pass for two).

    Piped, the text goes as it is (a script reads exactly what was stored); ``--json`` is the way
    to read any text exactly on a terminal.
    """
    if not _isatty(stream):
        return text
    return text.translate(_CONTROL_ONE_LINE if one_line else _CONTROL)


def as_json(value: Any, indent: int | None = 2) -> str:
    """``value`` as JSON for stdout: readable non-ASCII text, but nothing a terminal would act on."""
    return json.dumps(value, indent=indent, ensure_ascii=False).translate(_JSON_ESCAPES)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _enable_line_editing() -> None:
    try:
        import readline  # noqa: F401  (input() then edits lines and keeps a history)
    except ImportError:
        pass
