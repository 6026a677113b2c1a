"""Every Python and YAML block of README.md works as written, against the shipped etc/llm.yaml.

Python blocks run in order, each in a fresh namespace, from the repository
root, with the shipped configuration pointed at the fake provider
(``LLMCONN_PROVIDER_ADDRESS``, no keys, the in-memory store). YAML blocks
must parse; those that show llmconn configuration must load, and every
connection they show must be the shipped one of that name, key for key, so
the README never describes a file we do not ship.

A block that cannot run on its own (a line of a ``handle()`` method) is
marked by an HTML comment on the line before its fence, which readers of
the rendered README do not see::

    <!-- readme-test: skip (why) -->
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from llmconn import config as mod_config

ROOT = Path(__file__).resolve().parent.parent
SKIP_MARK = '<!-- readme-test: skip'
_fence = re.compile(r'^```(\w*)[ \t]*\n(.*?)^```[ \t]*$', re.M | re.S)


def blocks(language: str) -> list[tuple[int, str]]:
    """(line number, code) of every block in that language not marked as skipped."""
    text = (ROOT / 'README.md').read_text(encoding='utf-8')
    found = []
    for match in _fence.finditer(text):
        if match.group(1) != language:
            continue
        before = text[:match.start()].rstrip('\n').rsplit('\n', 1)[-1]
        if before.startswith(SKIP_MARK):
            continue
        found.append((text.count('\n', 0, match.start()) + 1, match.group(2)))
    return found


def shipped() -> dict:
    return yaml.safe_load((ROOT / 'etc' / 'llm.yaml').read_text(encoding='utf-8'))


def test_the_readme_has_blocks_to_check():
    assert blocks('python') and blocks('yaml')


@pytest.mark.parametrize('line, code', blocks('python'), ids=lambda v: f'line-{v}' if isinstance(v, int) else '')
def test_a_python_block_of_the_readme_runs_as_written(line, code, provider, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv('LLMCONN_PROVIDER_ADDRESS', provider.url)
    for name in ('REDIS_URL', 'ANTHROPIC_API_KEY', 'OPENAI_API_KEY', 'GEMINI_API_KEY', 'LLMCONN_API_KEY'):
        monkeypatch.delenv(name, raising=False)
    # dont_inherit: the block runs as a reader's file would, without this module's __future__ imports
    # (under which pydantic could not resolve a model's annotations in the block's namespace).
    exec(compile(code, f'README.md:{line}', 'exec', dont_inherit=True), {'__name__': f'readme_line_{line}'})


CONFIG_KEYS = {'redis', 'skills_dir', 'server', 'llm'}


def is_llmconn_config(data) -> bool:
    """A whole llm.yaml, or a list of its connections (other YAML, e.g. prometheus.yml, is not ours)."""
    if isinstance(data, dict):
        return bool(data) and set(data) <= CONFIG_KEYS
    return isinstance(data, list) and all(isinstance(c, dict) and {'name', 'model'} <= set(c) for c in data)


@pytest.mark.parametrize('line, code', blocks('yaml'), ids=lambda v: f'line-{v}' if isinstance(v, int) else '')
def test_a_yaml_block_of_the_readme_is_the_shipped_configuration(line, code):
    data = yaml.safe_load(code)             # every YAML block at least parses
    if not is_llmconn_config(data):
        return
    connections = data if isinstance(data, list) else data.get('llm', [])
    if isinstance(data, dict):
        mod_config.load_dict(data, base_dir=ROOT / 'etc', environ={})
        for key in set(data) - {'llm'}:
            assert data[key] == shipped()[key], f'README.md:{line}: "{key}" differs from etc/llm.yaml'
    else:
        mod_config.load_dict({'llm': data}, base_dir=ROOT / 'etc', environ={})
    by_name = {c['name']: c for c in shipped()['llm']}
    for conn in connections:
        assert conn['name'] in by_name, f'README.md:{line}: etc/llm.yaml has no connection "{conn["name"]}"'
        differs = {k: v for k, v in conn.items() if by_name[conn['name']].get(k) != v}
        assert not differs, f'README.md:{line}: "{conn["name"]}" differs from etc/llm.yaml in {differs}'
