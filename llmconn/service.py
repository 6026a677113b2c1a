"""Services as a Zato author writes them, run by ``llmconn serve``.

    from llmconn.service import Service

    class SupportChat(Service):
        name = 'demo.llm.support-chat'
        input = 'user_id', 'text', '-skill'

        def handle(self):
            conn = self.llm['Support']
            reply = conn.chat(self.request.input.text, chat_id=self.request.input.user_id)
            self.response.payload = {'reply': reply['text']}

A service is instantiated afresh for every request. The host gives it its
registry (``self.llm``), a correlation id (``self.cid``), a logger named
after the service and a way to call other deployed services
(``self.invoke``). Nothing here does I/O: the HTTP side lives in
:mod:`llmconn.server`, which turns exceptions into status codes.
"""

from __future__ import annotations

import logging
import re
import os
from typing import Any, Callable, Iterable, Iterator

from llmconn.errors import InvalidInput, LLMConnError, ServiceError, UnknownService  # noqa: F401 (re-exported for services)

# Zato's rule for turning a CamelCase class name into a service name.
_uncamel_boundary = re.compile(r'((?<=[a-z])[A-Z]|(?<!\A)[A-Z](?=[a-z]))')


class Bunch(dict):
    """A dict whose keys also read as attributes: ``self.request.input.text``."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value


class LLM:
    """The ``self.llm`` facade: ``self.llm['My Claude'].chat(...)``.

    It wraps a callable returning the current registry, so a registry that
    the host reloads (or replaces) is seen by the next lookup.
    """

    def __init__(self, source: Any) -> None:
        # A registry is not callable, so a callable here is a getter.
        self._get = source if callable(source) else (lambda: source)

    @property
    def registry(self) -> Any:
        return self._get()

    def __getitem__(self, name: str) -> Any:
        return self._get()[name]

    def __contains__(self, name: object) -> bool:
        return name in self._get()

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())

    def __repr__(self) -> str:
        return f'<LLM {list(self._get())}>'


def parse_io(spec: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``'text', '-chat_id'`` → (required, optional); a leading ``-`` marks an optional field."""
    if spec is None:
        return (), ()
    items = (spec,) if isinstance(spec, str) else tuple(spec)
    required, optional = [], []
    for item in items:
        if not isinstance(item, str) or not item.lstrip('-'):
            raise TypeError(f'input/output fields must be non-empty str, got {item!r}')
        (optional if item.startswith('-') else required).append(item.lstrip('-'))
    return tuple(required), tuple(optional)


class Request:
    """What the caller sent: ``payload`` (parsed JSON), ``input`` (declared fields), ``raw``, ``headers``."""

    def __init__(self, payload: Any = None, raw: bytes = b'', headers: dict | None = None) -> None:
        self.payload = payload
        self.raw = self.raw_request = raw
        self.headers = headers or {}
        self.input = Bunch()


class Response:
    """What the service answers: ``payload`` (dict/list → JSON, str → text), ``status_code``, ``headers``."""

    def __init__(self) -> None:
        self.payload: Any = None
        self.status_code = 200
        self.headers: dict[str, str] = {}
        self.content_type = ''
        self.events: Iterable | None = None

    def stream(self, events: Iterable) -> None:
        """Send ``events`` (e.g. ``conn.stream(...)``) to the HTTP client as Server-Sent Events."""
        self.events = events


class Service:
    """Base of every service the host deploys."""

    name: str | None = None
    input: Any = None
    output: Any = None
    # Our addition: when True the host refuses the call unless the server has API keys configured.
    requires_api_key = False

    def __init__(self, registry: Any = None, cid: str = '', invoker: Callable | None = None) -> None:
        self.cid = cid or new_cid()
        self._registry = registry if registry is not None else _no_registry
        self.llm = LLM(self._registry)
        self.request = Request()
        self.response = Response()
        self.logger = logging.getLogger(self.get_name())
        self._invoker = invoker

    @classmethod
    def get_name(cls) -> str:
        """The class's ``name``, else derived from module and class as Zato does: ``my-mod.my-service``."""
        if cls.__dict__.get('name'):
            return cls.__dict__['name']
        return convert_impl_name(f'{cls.__module__}.{cls.__name__}')

    def before_handle(self) -> None:
        """Called before ``handle``; override to prepare or check."""

    def handle(self) -> None:
        raise NotImplementedError(f'{type(self).__name__} must implement handle()')

    def after_handle(self) -> None:
        """Called after ``handle`` returned without an exception."""

    def invoke(self, service: 'str | type[Service]', payload: Any = None, **kwargs: Any) -> Any:
        """Run another service in this request (same cid) and return its response payload."""
        if payload is None and kwargs:
            payload = kwargs
        cls = service if isinstance(service, type) else self._lookup(service)
        instance = cls(self._registry, cid=self.cid, invoker=self._invoker)
        run(instance, payload)
        return instance.response.payload

    def _lookup(self, name: str) -> 'type[Service]':
        if self._invoker is None:
            raise UnknownService(f'no service named {name!r}: this service runs outside a host')
        return self._invoker(name)


def run(service: Service, payload: Any, raw: bytes = b'', headers: dict | None = None) -> Response:
    """Run one service call: input checks, the hooks, ``handle``, output checks."""
    service.request = Request(payload, raw, headers)
    service.request.input = _parse_input(type(service), payload)
    service.before_handle()
    service.handle()
    service.after_handle()
    _apply_output(type(service), service.response)
    return service.response


def _parse_input(cls: type[Service], payload: Any) -> Bunch:
    required, optional = parse_io(cls.input)
    if not required and not optional:
        return Bunch(payload) if isinstance(payload, dict) else Bunch()
    if not isinstance(payload, dict):
        raise InvalidInput(f'the request body must be a JSON object with the field(s) '
                           f'{", ".join(required + optional)}')
    missing = [name for name in required if payload.get(name) in (None, '')]
    if missing:
        raise InvalidInput(f'missing required input field(s): {", ".join(missing)}')
    return Bunch({name: payload.get(name) for name in required + optional})


def _apply_output(cls: type[Service], response: Response) -> None:
    """A declared ``output`` keeps only its fields and insists on the required ones, as SimpleIO does."""
    required, optional = parse_io(cls.output)
    if (not required and not optional) or not isinstance(response.payload, dict):
        return
    missing = [name for name in required if name not in response.payload]
    if missing:
        # The service broke its own contract: a server-side error, not the caller's fault.
        raise RuntimeError(f'service {cls.get_name()} did not set the output field(s) {", ".join(missing)}')
    response.payload = {k: v for k, v in response.payload.items() if k in required + optional}


def convert_impl_name(impl_name: str) -> str:
    """``my_mod.MyService`` → ``my-mod.my-service``: Zato's derived service name."""
    *path, class_name = impl_name.split('.')
    words = _uncamel_boundary.sub(r' \1', class_name).split()
    class_name = '-'.join(w.lower() for w in words).replace('_-', '_')
    return '.'.join([part.lower().replace('_', '-') for part in path] + [class_name])


def new_cid() -> str:
    """A correlation id: a random UUID (version 4) as 32 hex digits, as ``uuid.uuid4().hex`` (without its
    object, a fortieth of a gateway request's Python)."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40       # version 4
    raw[8] = raw[8] & 0x3F | 0x80       # the RFC 4122 variant
    return raw.hex()


def _no_registry() -> Any:
    raise LLMConnError('no LLM registry is bound: run the service under llmconn serve, or pass registry=')
