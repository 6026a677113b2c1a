"""What a log line says of a provider's error: everything but the provider's own words.

A provider's error message may quote the request ("your message '...' is
refused"); the caller's error keeps it, ``LLMError.logged()`` (what the host
and the gateway log) puts a placeholder in its place. Every provider mapping
that quotes a provider's words is checked, answers and mid-stream errors.
"""

from __future__ import annotations

import pytest

from llmconn.errors import WITHHELD, LLMError
from provider_helpers import make_provider, sse

WORDS = 'your message "the user wrote THIS-EXACT-TEXT" is refused'

ANSWERS = {
    'openai': {'error': {'message': WORDS, 'type': 'invalid_request_error'}},
    'openai-responses': {'id': 'resp_1', 'status': 'failed', 'output': [], 'error': {'message': WORDS}},
    'gemini': {'error': {'code': 400, 'status': 'INVALID_ARGUMENT', 'message': WORDS}},
}

STREAM_ERRORS = {
    'claude': {'type': 'error', 'error': {'type': 'invalid_request_error', 'message': WORDS}},
    'openai': {'error': {'message': WORDS}},
    'openai-responses': {'type': 'error', 'message': WORDS},
    'gemini': {'error': {'code': 400, 'message': WORDS}},
}


def _assert_withheld(error: LLMError) -> None:
    assert 'THIS-EXACT-TEXT' in str(error)                          # the caller sees what the provider said
    assert 'THIS-EXACT-TEXT' not in error.logged() and WITHHELD in error.logged()
    assert error.logged().replace(WITHHELD, '') == str(error).replace(error.quoted, '')    # the rest as it was


@pytest.mark.parametrize('provider', sorted(ANSWERS))
def test_an_error_answer_is_logged_without_the_providers_words(provider):
    with pytest.raises(LLMError) as caught:
        make_provider(provider).parse_response(ANSWERS[provider])
    _assert_withheld(caught.value)


@pytest.mark.parametrize('provider', sorted(STREAM_ERRORS))
def test_an_error_mid_stream_is_logged_without_the_providers_words(provider):
    with pytest.raises(LLMError) as caught:
        list(make_provider(provider).parse_stream(sse([STREAM_ERRORS[provider]])))
    _assert_withheld(caught.value)


def test_a_quote_changed_on_its_way_into_the_message_is_not_logged_at_all():
    # A secret masked inside the quote: the quote is no longer found, so nothing of it is logged.
    error = LLMError('Conn: provider answered HTTP 400: ***-THIS-EXACT-TEXT', status=400, connection='Conn',
                     quoted='sk-secret-THIS-EXACT-TEXT')
    assert error.logged() == f'Conn: LLMError (HTTP 400); {WITHHELD}'


def test_our_own_messages_are_logged_whole():
    error = LLMError('Conn: the provider did not answer within 30 s', connection='Conn')
    assert error.logged() == str(error)
