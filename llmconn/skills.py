"""Skills: ``skills_dir/<name>/SKILL.md`` files sent as the system prompt.

A skill file has YAML front matter (``name``, ``description``) and a body,
the instructions. Files are parsed once and cached; a cheap ``stat`` on each
use notices an edited file and re-reads it, so admins can change a skill
without a restart. Only bare names are accepted (no path character, no
trailing newline), and the file must resolve inside the skills directory,
symlinks followed: a SKILL.md linked to ``/etc/passwd`` is refused, not sent
as a system prompt. Messages name skills relative to the directory, never by
absolute path, since they reach clients.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from llmconn.errors import ConfigError, InvalidInput
from llmconn.yamlfile import NoAliasLoader

SKILL_FILE_NAME = 'SKILL.md'
_bare_name = re.compile(r'^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$')
_front_matter = re.compile(r'\A---\s*\n(.*?)\n---\s*(?:\n|\Z)', re.S)


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    instructions: str


class SkillCache:
    """Skills of one directory, parsed once and re-read when their file changes."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self._root = self.directory.resolve()
        self._cache: dict[str, tuple[tuple[int, int], Skill]] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> Skill:
        """The skill of that name; InvalidInput if the name is not bare or has no file."""
        if not isinstance(name, str) or not _bare_name.fullmatch(name) or '..' in name:
            raise InvalidInput(f'skill name {name!r:.140} is not valid; use a bare directory name of the '
                               f'skills directory such as "support-agent"')
        shown = f'{name}/{SKILL_FILE_NAME}'
        path = self.directory / name / SKILL_FILE_NAME
        try:
            real = path.resolve(strict=True)
            stat = real.stat()
        except (OSError, RuntimeError):
            raise InvalidInput(f'skill "{name}" not found: create {shown} in the skills directory') from None
        if not real.is_relative_to(self._root):
            raise InvalidInput(f'skill "{name}": {shown} leads outside the skills directory (a symlink?); '
                               f'skills must live inside it')
        stamp = (stat.st_mtime_ns, stat.st_size)
        cached = self._cache.get(name)
        if cached and cached[0] == stamp:
            return cached[1]
        skill = self._parse(name, real, shown)
        with self._lock:
            self._cache[name] = (stamp, skill)
        return skill

    def names(self) -> list[str]:
        """Names of the skills whose file resolves inside the directory."""
        if not self.directory.is_dir():
            return []
        found = []
        for path in self.directory.glob(f'*/{SKILL_FILE_NAME}'):
            name = path.parent.name
            if _bare_name.fullmatch(name) and path.resolve().is_relative_to(self._root):
                found.append(name)
        return sorted(found)

    @staticmethod
    def _parse(name: str, path: Path, shown: str) -> Skill:
        try:
            text = path.read_text(encoding='utf-8')
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidInput(f'skill "{name}": {shown} cannot be read as UTF-8 text '
                               f'({type(e).__name__})') from None
        meta: Any = {}
        match = _front_matter.match(text)
        if match:
            try:
                meta = yaml.load(match.group(1), Loader=NoAliasLoader) or {}
            except (yaml.YAMLError, ConfigError):
                raise InvalidInput(f'skill "{name}": the front matter of {shown} is not valid YAML '
                                   f'(aliases are not allowed either)') from None
            if not isinstance(meta, dict):
                raise InvalidInput(f'skill "{name}": the front matter of {shown} must be a mapping')
            text = text[match.end():]
        instructions = text.strip()
        if not instructions:
            raise InvalidInput(f'skill "{name}": {shown} has no instructions after its front matter')
        return Skill(name=str(meta.get('name') or name), description=str(meta.get('description') or ''),
                     instructions=instructions)
