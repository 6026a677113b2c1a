"""The fast runners' own packer sends exactly what redis-py's would."""

from __future__ import annotations

import pytest
from redis.connection import Connection
from redis.exceptions import DataError

from llmconn.store.runner import packed

EVALSHA = ('EVALSHA', 'a' * 40, 4, 'llmconn:{conn\x00chat}:lock', 'llmconn:{conn\x00chat}:turns', 'kë', '鍵',
           '0' * 32, b'{"u":"hi","a":"there"}', 100, 60000, b'0', b'')


@pytest.mark.parametrize('command', [
    EVALSHA,
    ('WAIT', 1, 1000),
    ('SET', 'x', -5),
    ('SET', 'x', 1.5),
    ('SET', 'x', b'y' * 200_000),               # past redis-py's buffer cutoff
    ('SET', 'x', memoryview(b'a view')),
    ('SET', 'x', b''),
], ids=['evalsha', 'wait', 'negative', 'float', 'large', 'memoryview', 'empty'])
def test_packed_is_byte_for_byte_redis_py(command):
    conn = Connection()
    assert b''.join(packed(conn, command)) == b''.join(conn.pack_commands([command]))


def test_two_commands_are_one_buffer_in_order():
    conn = Connection()
    out = packed(conn, EVALSHA, ('WAIT', 1, 1000))
    assert len(out) == 1
    assert out[0] == b''.join(conn.pack_commands([EVALSHA, ('WAIT', 1, 1000)]))


@pytest.mark.parametrize('value', [True, None, object()], ids=['bool', 'none', 'object'])
def test_what_redis_py_refuses_is_refused(value):
    with pytest.raises(DataError):
        packed(Connection(), ('SET', 'x', value))


def test_a_lone_surrogate_in_a_key_is_refused_as_redis_py_refuses_it():
    with pytest.raises(UnicodeEncodeError):
        packed(Connection(), ('GET', 'bad\ud800'))
    with pytest.raises(UnicodeEncodeError):
        Connection().pack_commands([('GET', 'bad\ud800')])
