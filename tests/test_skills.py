"""Skills: front matter, the cache, reload on change, and names that cannot escape the directory."""

from __future__ import annotations

import os

import pytest

from llmconn.errors import InvalidInput
from llmconn.skills import SkillCache


def write_skill(root, name, body, description='helps'):
    path = root / name / 'SKILL.md'
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'---\nname: {name}\ndescription: {description}\n---\n{body}\n')
    return path


def test_front_matter_and_instructions(tmp_path):
    write_skill(tmp_path, 'support-agent', 'Be brief.\nBe kind.')
    skill = SkillCache(tmp_path).get('support-agent')
    assert (skill.name, skill.description, skill.instructions) == ('support-agent', 'helps', 'Be brief.\nBe kind.')


def test_cached_then_reloaded_when_the_file_changes(tmp_path):
    path = write_skill(tmp_path, 's', 'first')
    cache = SkillCache(tmp_path)
    first = cache.get('s')
    assert cache.get('s') is first
    write_skill(tmp_path, 's', 'second version')
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert cache.get('s').instructions == 'second version'


@pytest.mark.parametrize('name', ['../x', 'a/b', '.hidden', '', 'a..b', '/etc', 'x' * 200])
def test_only_bare_names(tmp_path, name):
    with pytest.raises(InvalidInput, match='not valid'):
        SkillCache(tmp_path).get(name)


def test_missing_skill_says_where_to_create_it(tmp_path):
    with pytest.raises(InvalidInput, match='create .*nope/SKILL.md'):
        SkillCache(tmp_path).get('nope')


def test_file_without_front_matter_is_all_instructions(tmp_path):
    (tmp_path / 'plain').mkdir()
    (tmp_path / 'plain' / 'SKILL.md').write_text('Just do it.\n')
    assert SkillCache(tmp_path).get('plain').instructions == 'Just do it.'
    assert SkillCache(tmp_path).names() == ['plain']


@pytest.mark.parametrize('name', ['terse\n', 'terse\r', 'ter se', 'a\\b', 'a:b', 'C:x', 'terse\x00'])
def test_a_name_with_a_trailing_newline_or_any_path_character_is_refused(tmp_path, name):
    write_skill(tmp_path, 'terse', 'Be brief.')
    with pytest.raises(InvalidInput, match='not valid'):
        SkillCache(tmp_path).get(name)


def test_a_skill_md_symlinked_outside_the_directory_is_refused(tmp_path):
    secret = tmp_path / 'outside.txt'
    secret.write_text('root:x:0:0:root:/root:/bin/bash\n')
    skills = tmp_path / 'skills'
    (skills / 'evil').mkdir(parents=True)
    (skills / 'evil' / 'SKILL.md').symlink_to(secret)
    with pytest.raises(InvalidInput, match='outside the skills directory') as info:
        SkillCache(skills).get('evil')
    assert str(tmp_path) not in str(info.value)
    assert SkillCache(skills).names() == []


def test_a_skill_directory_symlinked_outside_is_refused_but_inside_links_work(tmp_path):
    elsewhere = tmp_path / 'elsewhere'
    write_skill(elsewhere, 'away', 'Leaked.')
    skills = tmp_path / 'skills'
    write_skill(skills, 'real', 'Be brief.')
    (skills / 'away').symlink_to(elsewhere / 'away')
    (skills / 'alias').symlink_to(skills / 'real')
    cache = SkillCache(skills)
    with pytest.raises(InvalidInput, match='outside'):
        cache.get('away')
    assert cache.get('alias').instructions == 'Be brief.'
    assert cache.names() == ['alias', 'real']


def test_error_messages_never_give_absolute_paths(tmp_path):
    (tmp_path / 'bad').mkdir()
    (tmp_path / 'bad' / 'SKILL.md').write_text('---\n: [\n---\nBody\n')
    (tmp_path / 'empty').mkdir()
    (tmp_path / 'empty' / 'SKILL.md').write_text('---\nname: e\n---\n')
    cache = SkillCache(tmp_path)
    for name in ('nope', 'bad', 'empty', '../x'):
        with pytest.raises(InvalidInput) as info:
            cache.get(name)
        assert str(tmp_path) not in str(info.value), info.value
