"""Reading configuration YAML safely: no aliases, no quoted secrets, environment references expanded.

Aliases are refused as the composer meets them, so a small file cannot
expand into a huge one; syntax errors say where, never what the line holds;
``${VAR}``, ``${VAR:-default}`` and Zato's ``Zato_Enmasse_Env.VAR`` are
expanded in every string of the parsed tree.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import yaml

from llmconn.errors import ConfigError

_env_pattern = re.compile(r'\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}')
_zato_env_pattern = re.compile(r'^Zato_Enmasse_Env\.([A-Za-z_][A-Za-z0-9_]*)$')


# A configuration is a few kB; these bound what a hostile or broken file can cost to read.
MAX_CONFIG_CHARS = 1_000_000    # 50 MB took minutes to parse
MAX_DEPTH = 64                  # nesting; 20,000 levels of [[[...]]] overflowed the Python stack


class NoAliasLoader(yaml.SafeLoader):
    """SafeLoader refusing aliases as it meets them, before anything is built or walked.

    Eight levels of ``*alias`` made a 549-byte file expand into gigabytes
    ("billion laughs"). A configuration has no need of them, so the first
    alias is an error; anchors alone are harmless and ignored. Nesting deeper
    than :data:`MAX_DEPTH` is refused too, before the recursive composer
    runs out of stack.
    """

    _depth = 0

    def compose_node(self, parent, index):
        mark = self.peek_event().start_mark
        if self.check_event(yaml.AliasEvent):
            raise ConfigError(f'line {mark.line + 1}: YAML aliases (*name, <<: *name) are not allowed in a '
                              f'configuration: they let a small file expand without bound; write the values out')
        if self._depth >= MAX_DEPTH:
            raise ConfigError(f'line {mark.line + 1}: nested more than {MAX_DEPTH} levels deep; a configuration '
                              f'needs far fewer')
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def parse_yaml(text: str, source: str) -> Any:
    """The YAML document in ``text``; any problem is a ConfigError naming ``source``.

    A syntax error says where and what, but never quotes the line: it may hold a secret.
    """
    if len(text) > MAX_CONFIG_CHARS:
        raise ConfigError(f'{source}: {len(text):,} characters, more than a configuration needs '
                          f'(limit {MAX_CONFIG_CHARS:,}); is this the right file?')
    try:
        return yaml.load(text, Loader=NoAliasLoader) or {}
    except ConfigError as e:
        raise ConfigError(f'{source}: {e}') from None
    except yaml.MarkedYAMLError as e:
        where = f' at line {e.problem_mark.line + 1}, column {e.problem_mark.column + 1}' if e.problem_mark else ''
        what = '; '.join(str(x) for x in (e.context, e.problem) if x)
        raise ConfigError(f'{source}: not valid YAML{where}: {what}; fix the syntax there') from None
    except yaml.YAMLError as e:
        raise ConfigError(f'{source}: not valid YAML ({type(e).__name__}); fix the syntax') from None


def expand_env(value: Any, where: str, environ: Mapping[str, str]) -> Any:
    """Expand environment references in every string of a loaded YAML tree."""
    if isinstance(value, dict):
        return {k: expand_env(v, f'{where}.{k}' if where else str(k), environ) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, f'{where}[{i}]', environ) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value
    zato = _zato_env_pattern.match(value)
    if zato:
        value = '${' + zato.group(1) + '}'

    def substitute(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        raise ConfigError(f'environment variable {name} is not set ({where}); export it or write '
                          f'${{{name}:-default}} to give a default')

    return _env_pattern.sub(substitute, value)
