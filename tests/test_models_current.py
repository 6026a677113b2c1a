"""Every Claude model the project names is one the installed Anthropic SDK lists and has not deprecated.

The examples used ``claude-sonnet-4-5`` past its end-of-life (2026-11-30);
the SDK knew, but a blanket ``ignore::DeprecationWarning`` hid it. This test
reads the SDK's own lists, so the next deprecation fails here, not in production.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest
from anthropic._data import DEPRECATED_MODELS
from anthropic.types import ModelParam

from llmconn.testing import fake_claude

ROOT = Path(__file__).resolve().parent.parent
_claude_model = re.compile(r'\bclaude-(?:opus|sonnet|haiku|fable|mythos)-[0-9][0-9a-z-]*')


def sdk_models() -> set[str]:
    literal = next(arg for arg in typing.get_args(ModelParam) if typing.get_origin(arg) is typing.Literal)
    return set(typing.get_args(literal))


def named_models() -> dict[str, set[str]]:
    files = [ROOT / 'README.md', *sorted((ROOT / 'etc').glob('*.yaml')), *sorted((ROOT / 'docs').glob('*.md')),
             *sorted((ROOT / 'llmconn').rglob('*.py')), *sorted((ROOT / 'services').glob('*.py'))]
    found: dict[str, set[str]] = {}
    for path in files:
        for model in _claude_model.findall(path.read_text(encoding='utf-8')):
            found.setdefault(model.rstrip('-'), set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_examples_and_the_fake_name_claude_models():
    assert 'etc/llm.yaml' in {f for files in named_models().values() for f in files}
    assert fake_claude.MODELS


@pytest.mark.parametrize('model', sorted(set(named_models()) | set(fake_claude.MODELS)))
def test_every_named_claude_model_is_current_in_the_installed_sdk(model):
    assert model in sdk_models(), f'{model} is not a model the anthropic SDK knows; use a current one'
    assert model not in DEPRECATED_MODELS, (f'{model} is deprecated (end of life {DEPRECATED_MODELS[model]}); '
                                            f'use a current model')
