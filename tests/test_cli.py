"""The llmconn command, run as a user runs it: a separate process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def llmconn(*args, env=None):
    return subprocess.run([sys.executable, '-m', 'llmconn', *args], capture_output=True, text=True, timeout=60,
                          env=env)


@pytest.fixture
def config(tmp_path, provider):
    path = tmp_path / 'llm.yaml'
    path.write_text(textwrap.dedent(f'''
        llm:
          - name: Fake Claude
            model: claude-sonnet-5-5
            address: {provider.url}
            secret: sk-cli-secret-never-printed
          - name: Fake OpenAI
            provider: openai
            model: gpt-4o-mini
            address: {provider.url}/v1
    '''))
    return path


def test_check_lists_connections_without_secrets(config):
    done = llmconn('check', str(config))
    assert done.returncode == 0, done.stderr
    assert 'Fake Claude: provider=claude model=claude-sonnet-5-5' in done.stdout
    assert 'Fake OpenAI: provider=openai' in done.stdout
    assert 'sk-cli-secret' not in done.stdout + done.stderr


def test_check_shows_each_connections_fallbacks(config):
    config.write_text(config.read_text().replace('secret: sk-cli-secret-never-printed',
                                                 'secret: sk-cli-secret-never-printed\n    fallbacks: [Fake OpenAI]'))
    done = llmconn('check', str(config))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.strip().startswith('Fake Claude:') and 'fallbacks=Fake OpenAI [secret set]' in line for line in lines)
    assert 'fallbacks=' not in next(line for line in lines if line.strip().startswith('Fake OpenAI:'))


def test_check_of_a_bad_file_exits_1_with_the_error(tmp_path):
    path = tmp_path / 'bad.yaml'
    path.write_text('llm:\n  - name: x\n    model: m\n    provider: nope\n')
    done = llmconn('check', str(path))
    assert done.returncode == 1
    assert 'unknown provider' in done.stderr and str(path) in done.stderr


def test_invoke_chat_and_ping(config):
    done = llmconn('invoke', 'Fake OpenAI', 'hello from the shell', '--config', str(config))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == 'echo: hello from the shell | users: 1 | previous: - | system: no'
    assert llmconn('ping', 'Fake Claude', '--config', str(config)).stdout.strip() == 'Fake Claude: OK'
    missing = llmconn('invoke', 'Nope', 'x', '--config', str(config))
    assert missing.returncode == 1 and '"Fake Claude", "Fake OpenAI"' in missing.stderr


# -- the command line itself --------------------------------------------------------------------

def test_verbose_flag_is_accepted_after_the_subcommand(config):
    for argv in (['-v', 'check', str(config)], ['check', str(config), '-v'], ['check', '-v', str(config)]):
        done = llmconn(*argv)
        assert done.returncode == 0, (argv, done.stderr)


def test_every_argument_of_every_subcommand_has_help_text():
    import argparse

    from llmconn.cli import _parser
    parser = _parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f'{name} {action.dest}' for name, sub in subparsers.choices.items() for action in sub._actions
               if action.help is None]
    assert not missing


def test_closed_pipe_exits_quietly_without_a_traceback(tmp_path):
    # Many connections, so the output is larger than what `head -c 1` reads and the pipe buffer holds.
    path = tmp_path / 'many.yaml'
    path.write_text('llm:\n' + ''.join(f'  - name: conn-{i}\n    model: claude-x\n    address: http://127.0.0.1:9\n'
                                       for i in range(3000)))
    done = subprocess.run(f'{sys.executable} -m llmconn check {path} | head -c 1', shell=True, capture_output=True,
                          text=True, timeout=120)
    assert 'Traceback' not in done.stderr and 'BrokenPipe' not in done.stderr, done.stderr


def test_importing_the_library_neither_patches_nor_loads_requests_or_redis():
    code = ('import sys, llmconn, llmconn.cli, llmconn.server  # what llmconn serve imports before patching\n'
            'llmconn.cli._parser()  # every subcommand registered\n'
            'heavy = [m for m in ("requests", "redis", "urllib3") if m in sys.modules]\n'
            'assert not heavy, heavy\n'
            'assert llmconn.Registry.__name__ == "Registry" and llmconn.ChatBusy.__name__ == "ChatBusy"\n'
            'assert all(getattr(llmconn, name) for name in llmconn.__all__)\n'
            'from gevent import monkey\n'
            'assert not monkey.is_module_patched("socket")\n')
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_serve_refuses_to_patch_after_requests_was_imported():
    code = ('import requests\n'
            'from llmconn.server import main\n'
            'raise SystemExit(main(["--port", "0"]))\n')
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and 'requests' in done.stderr and 'Traceback' not in done.stderr


def test_worker_command_line_is_derived_from_the_serve_flags():
    from llmconn.server import serve_parser, worker_argv
    args = serve_parser().parse_args(['--port', '18000', '--workers', '3', '--idle-timeout', '5',
                                      '--config', 'x.yaml', '--log-level', 'DEBUG'])
    argv = worker_argv(args, 7)
    assert '--workers' not in argv and argv[-2:] == ['--listen-fd', '7']
    again = serve_parser().parse_args(argv)
    assert worker_argv(serve_parser().parse_args(['--no-metrics']), 7)[:1] == ['--no-metrics']
    assert (again.port, again.idle_timeout, again.config, again.log_level, again.workers) == \
        (18000, 5.0, 'x.yaml', 'DEBUG', 1)


@pytest.mark.parametrize('flags', [['--port', '99999'], ['--idle-timeout', '0'], ['--workers', '0'],
                                   ['--max-connections', '-1'], ['--grace', '-1']])
def test_serve_refuses_impossible_flags_without_a_traceback(flags):
    done = llmconn('serve', '--config', 'no-such.yaml', *flags)
    assert done.returncode == 2 and done.stderr.startswith('error: ') and 'Traceback' not in done.stderr
