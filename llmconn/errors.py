"""Every exception llmconn raises, in one shallow tree.

Third-party exceptions (``requests``, ``redis``) are translated into these at
exactly one boundary each: :mod:`llmconn.transport` and :mod:`llmconn.store`.
Messages say what to do next. None of them ever carries a secret.
"""

from __future__ import annotations

from typing import Any


class LLMConnError(Exception):
    """Base of every llmconn error."""


class ConfigError(LLMConnError):
    """The configuration is invalid; the message names the file, connection and field."""


class InvalidInput(LLMConnError, ValueError):
    """A call's arguments are invalid; raised before any network call."""


class UnknownConnection(LLMConnError, KeyError):
    """No connection of that name is configured; the message lists the known ones."""

    def __str__(self) -> str:
        # KeyError.__str__ would repr() the message and wrap it in quotes.
        return str(self.args[0]) if self.args else ''


class InactiveConnection(LLMConnError):
    """The connection is configured with ``is_active: false`` and refuses calls."""


# What a log line says instead of the provider's own words.
WITHHELD = "<the provider's message: in the caller's error, not in logs>"


class LLMError(LLMConnError):
    """The provider failed or answered with an error.

    ``status`` is the HTTP status (None when no response arrived),
    ``provider_body`` the provider's body verbatim (parsed JSON when it was
    JSON, else the text), ``connection`` the connection's name, ``quoted``
    the provider's own words that the message quotes ('' when none).
    """

    def __init__(self, message: str, *, status: int | None = None, provider_body: Any = None,
                 connection: str = '', quoted: str = '') -> None:
        super().__init__(message)
        self.status = status
        self.provider_body = provider_body
        self.connection = connection
        self.quoted = quoted

    def logged(self) -> str:
        """The message as a log line carries it: without the provider's words, which may quote the request."""
        text = str(self)
        if not self.quoted:
            return text
        if self.quoted in text:
            return text.replace(self.quoted, WITHHELD)
        # The quote was changed on its way into the message (a secret masked in it): say only what is ours.
        status = f'HTTP {self.status}' if self.status else 'no HTTP status'
        return f'{self.connection}: {type(self).__name__} ({status}); {WITHHELD}'


class LLMTimeout(LLMError):
    """The provider did not answer within the connection's ``timeout``."""


class LLMUnreachable(LLMError):
    """No whole answer arrived: the provider could not be reached, or the connection broke mid-answer."""


class LLMRateLimited(LLMError):
    """The provider kept answering 429 (or 529) after every retry.

    ``retry_after`` is the wait in seconds the provider's last answer asked
    for (``retry-after-ms``, ``Retry-After``, or OpenAI's reset of a spent
    ``x-ratelimit-*`` counter), None when it named none.
    """

    def __init__(self, message: str, *, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after = retry_after


class LLMAuthError(LLMError):
    """The provider refused the credentials (401 or 403)."""


class StructuredOutputError(LLMError):
    """The answer to a ``schema=`` call did not parse or validate (``.text``), or the model refused (``.refusal``)."""

    def __init__(self, message: str, *, text: str = '', refusal: str = '', **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.text = text
        self.refusal = refusal


class ChatBusy(LLMConnError):
    """Another call held the chat's lock for longer than ``lock_wait``."""


class StoreError(LLMConnError):
    """The chat store (Redis) failed; nothing was sent to the provider."""


class LockLost(StoreError):
    """The chat's lock expired during the call, so its turn was not saved."""


class StoreAuthError(StoreError):
    """Redis refused the user name or password of ``redis.url``."""


class UnknownService(LLMConnError, KeyError):
    """No deployed service has that name."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ''


class ServiceError(LLMConnError):
    """A service's own error for its caller: ``status`` and a message safe to show to the client."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class ToolLoopLimit(LLMConnError):
    """The model kept asking for tools past ``max_tool_rounds`` provider calls; nothing was saved."""


class GatewayError(LLMConnError):
    """A gateway request refused with an OpenAI-shaped error: ``status``, ``type``, ``param``, ``code``."""

    def __init__(self, message: str, status: int = 400, *, type: str = 'invalid_request_error',
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {'error': {'message': str(self), 'type': self.type, 'param': self.param, 'code': self.code}}


class WebSocketClosed(LLMConnError):
    """The client's WebSocket is closed (it left, idled too long, or broke the protocol): nothing more goes out."""


class LimitExceeded(GatewayError):
    """A gateway key's rpm, tpm or budget refuses a request: 429, with ``Retry-After`` and its rate headers."""

    def __init__(self, message: str, code: str, headers: list, kind: str = 'requests') -> None:
        # OpenAI's error type: insufficient_quota for a budget, else what ran out ('requests' or 'tokens').
        super().__init__(message, 429, type=code if code == 'insufficient_quota' else kind, code=code)
        self.rate_headers = headers         # the routes add them to the answer
