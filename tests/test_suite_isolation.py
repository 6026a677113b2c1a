"""The suite keeps to the Redis servers it starts (SPEC §14)."""

import os

import redis


def test_the_suite_never_uses_a_redis_it_did_not_start(redis_url):
    if os.environ.get('LLMCONN_TEST_REDIS_URL'):
        return                                  # the operator gave the tests that server to own
    port = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs['port']
    assert port != 6379
