"""The host's SSE body (``llmconn.responses.sse_response``): what a client that leaves does to it."""

from __future__ import annotations

import logging

from llmconn.responses import sse_response
from llmconn.types import Event


def _events(closed: list):
    try:
        yield Event('text', text='first ')
        yield Event('text', text='second')
        yield Event('done', result={'text': 'first second'})
    finally:
        closed.append(True)


def test_a_client_that_leaves_closes_the_events_at_once_and_logs_no_error(caplog):
    # The server closes the body when the client goes away: the call's events must be closed then,
    # not when the garbage collector gets to them, and nothing is reported as a failure.
    closed: list = []
    status, _, body = sse_response(_events(closed), 'cid-1')
    with caplog.at_level(logging.DEBUG):
        assert status == 200 and next(body).startswith(b'event: text')
        body.close()
    assert closed == [True]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_a_failure_mid_stream_is_an_error_event_and_closes_the_events(caplog):
    closed: list = []

    def failing():
        try:
            yield Event('text', text='first ')
            raise RuntimeError('the provider broke')
        finally:
            closed.append(True)

    _, _, body = sse_response(failing(), 'cid-2')
    with caplog.at_level(logging.ERROR):
        chunks = list(body)
    assert chunks[-1].startswith(b'event: error') and b'"cid": "cid-2"' in chunks[-1]
    assert closed == [True]
