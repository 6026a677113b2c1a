"""The log of ``llmconn serve``: text or one JSON object per line, no secret in either.

``--log-format text`` (the default) writes the classic line::

    2026-12-01 09:30:00,123 4242 INFO llmconn.server: POST /demo.llm.ask 200 12.3ms cid=3f... \
connection=Support tokens=4/14

``--log-format json`` writes one object per line, for a log shipper::

    {"time": "2026-12-01T09:30:00.123Z", "level": "INFO", "logger": "llmconn.server", "pid": 4242,
     "cid": "3f...", "service": "demo.llm.ask", "connection": "Support", "status": 200,
     "duration": 0.0123, "tokens": {"input": 4, "output": 14}, "method": "POST", "path": "/demo.llm.ask",
     "message": "POST /demo.llm.ask 200 12.3ms"}

Every request gets one access line, written when its last byte is sent (so
a stream's line has the stream's tokens and whole duration). Other lines
written while a request is served carry its cid, service and connection
(from :func:`llmconn.observe.current`). In JSON every line has the access
line's keys, null where they do not apply. ``duration`` is in seconds.

What never appears: message texts (llmconn logs none: not the user's, not
the model's, not a provider's error message, which may quote the request)
and secrets. Every configured secret (connection secrets, API
keys, the Redis password, the metrics key) is masked in every line,
including tracebacks, in both formats: a service that puts a key into an
exception message does not get it into the log.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time as mod_time
from typing import Any, Callable, Iterable
from urllib.parse import urlsplit

from llmconn import observe
from llmconn.redact import MASK

FORMATS = ('text', 'json')
TEXT_FORMAT = '%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s'
MIN_SECRET_CHARS = 4        # masking shorter strings would garble every line and hide nothing
MAX_PATH_CHARS = 200        # a path is the client's to choose; keep a hostile one from filling the log
METRICS_KEY_ENV = 'LLMCONN_METRICS_KEY'


def configure(fmt: str = 'text', level: str = 'INFO', stream=None) -> logging.Handler:
    """Send every log record (and Python warnings) to ``stream`` (stderr) in ``fmt``."""
    if fmt not in FORMATS:
        raise ValueError(f'unknown log format {fmt!r}; use one of: {", ".join(FORMATS)}')
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == 'json' else TextFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(True)
    _route_uncaught_errors()
    return handler


def _route_uncaught_errors() -> None:
    """Tracebacks nobody caught (a thread's, a greenlet's) go through the log too, not raw to stderr.

    A raw traceback would break a JSON log into lines that are not JSON, and
    would not be scrubbed of secrets.
    """
    errors = logging.getLogger('llmconn.errors')

    def thread_failed(info) -> None:
        errors.error('Uncaught error in thread %s', getattr(info.thread, 'name', '?'),
                     exc_info=(info.exc_type, info.exc_value, info.exc_traceback))

    threading.excepthook = thread_failed
    if 'gevent' in sys.modules:         # the server process; the supervisor never imports gevent
        import gevent

        def greenlet_failed(context, kind, value, tb) -> None:
            errors.error('Uncaught error in %s', _describe(context), exc_info=(kind, value, tb))

        gevent.get_hub().print_exception = greenlet_failed


def _describe(context: Any) -> str:
    try:
        return str(context)[:200]
    except Exception:
        return type(context).__name__


def hide_secrets(registry: Any) -> None:
    """Mask the secrets of ``registry``'s configuration (as it is now, and after reloads) in every line."""
    secrets = Secrets(registry)
    for handler in logging.getLogger().handlers:
        formatter = handler.formatter
        if isinstance(formatter, (TextFormatter, JsonFormatter)):
            formatter.scrub = secrets.scrub


def access(logger: logging.Logger, tally: observe.RequestTally) -> None:
    """The access line of one finished request."""
    if not logger.isEnabledFor(logging.INFO):
        return
    path = tally.path[:MAX_PATH_CHARS]
    line = f'{tally.method} {path} {tally.status} {tally.duration * 1000:.1f}ms'
    fields = {'cid': tally.cid, 'service': tally.service or None, 'connection': ','.join(tally.connections) or None,
              'status': tally.status, 'duration': round(tally.duration, 6),
              'tokens': {'input': tally.input_tokens, 'output': tally.output_tokens},
              'method': tally.method, 'path': path}
    logger.info(line, extra={'llmconn_access': fields})


class TextFormatter(logging.Formatter):
    """The classic line; an access line gets its cid, connection and tokens appended."""

    scrub: Callable[[str], str] = staticmethod(lambda text: text)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = getattr(record, 'llmconn_access', None)
        if fields is not None:
            tokens = fields['tokens']
            text += f' cid={fields["cid"]}'
            if fields['connection']:
                text += f' connection={fields["connection"]}'
            text += f' tokens={tokens["input"]}/{tokens["output"]}'
        else:
            tally = observe.current()
            if tally is not None and tally.cid not in text:
                text += f' cid={tally.cid}'
        return self.scrub(text)


_NO_REQUEST = {'cid': None, 'service': None, 'connection': None, 'status': None, 'duration': None, 'tokens': None}


class JsonFormatter(logging.Formatter):
    """One JSON object per record; see the module docstring for its fields."""

    scrub: Callable[[str], str] = staticmethod(lambda text: text)

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {'time': _iso(record.created), 'level': record.levelname, 'logger': record.name,
                                 'pid': record.process}
        fields = getattr(record, 'llmconn_access', None)
        if fields is not None:
            entry.update(fields)
        else:
            # Every line has the access line's keys, null where they do not apply (one schema to ship).
            entry.update(_NO_REQUEST)
            tally = observe.current()
            if tally is not None:
                entry.update(cid=tally.cid, service=tally.service or None,
                             connection=','.join(tally.connections) or None)
        entry['message'] = self.scrub(record.getMessage())
        if record.exc_info:
            entry['exc'] = self.scrub(self.formatException(record.exc_info))
        elif record.stack_info:
            entry['stack'] = self.scrub(self.formatStack(record.stack_info))
        return json.dumps(entry, ensure_ascii=False, default=str)


class Secrets:
    """The secrets of a registry's current configuration, recomputed only when it is reloaded."""

    def __init__(self, registry: Any) -> None:
        self._registry = registry
        self._config = None
        self._secrets: tuple[str, ...] = ()

    def scrub(self, text: str) -> str:
        for secret in self._current():
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    def _current(self) -> tuple[str, ...]:
        config = self._registry.config
        if config is not self._config:
            self._secrets = tuple(sorted(set(_secrets_of(config)), key=len, reverse=True))
            self._config = config
        return self._secrets


def _secrets_of(config: Any) -> Iterable[str]:
    """Every secret string a configuration holds (long enough to mask)."""
    values = [conn.secret_value for conn in config.llm]
    values += [key.get_secret_value() for key in config.server.api_keys]
    values.append(os.environ.get(METRICS_KEY_ENV, ''))
    try:
        values.append(urlsplit(config.redis.url).password or '')
    except ValueError:
        pass
    return [v for v in values if v and len(v) >= MIN_SECRET_CHARS]


def _iso(ts: float) -> str:
    return mod_time.strftime('%Y-%m-%dT%H:%M:%S', mod_time.gmtime(ts)) + f'.{int(ts % 1 * 1000):03d}Z'
