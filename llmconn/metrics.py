"""Prometheus metrics of ``llmconn serve``: an :class:`~llmconn.observe.Observer` that counts.

    llmconn_requests_total{service,status}            HTTP requests served
    llmconn_request_duration_seconds{service}          whole request, until the last byte (streams too)
    llmconn_provider_calls_total{connection,status}   HTTP attempts to providers (code, timeout, unreachable)
    llmconn_provider_retries_total{connection}         attempts that were retries
    llmconn_provider_call_duration_seconds{connection} one attempt, until the answer (its headers, for a stream)
    llmconn_call_errors_total{connection,error}        invoke/chat/stream calls that raised, by error class
    llmconn_chat_busy_total{connection}                chat calls that gave up waiting for the lock
    llmconn_failovers_total{connection,fallback,reason} calls that moved on to a fallback (llmconn.failover)
    llmconn_lock_wait_seconds{connection}              waits for the chat lock (0: free), ChatBusy ones too
    llmconn_input_tokens_total{connection}             tokens sent, as the providers counted them
    llmconn_output_tokens_total{connection}            tokens received
    llmconn_cache_read_tokens_total{connection}        input tokens read from the provider's prompt cache
    llmconn_cache_write_tokens_total{connection}       input tokens written to it
    llmconn_reasoning_tokens_total{connection}         output tokens spent on reasoning
    llmconn_store_errors_total{error}                  chat store failures, by redis exception class
    llmconn_services_deployed                          services this host serves

Label values are bounded: services are the deployed ones (any other path is
``other``), connections come from the configuration, statuses and errors
are codes and class names. No label ever carries a chat id, a text or a key.

A hook only adds to a dict. What the hooks added is written to the values
in batches (:meth:`Metrics.flush`): once a second by a greenlet, before
every scrape this process answers, and when the server stops. So a chat
call does not pay prometheus_client's lock, pid check and memory-mapped
write per value (28 µs of CPU for a served chat call), and a batch writes each
touched series once. Histograms are flushed through their ``_sum`` and
``_buckets`` values (what ``Histogram.observe`` itself increments);
``tests/test_metrics.py`` checks the exposition against call-by-call
``observe`` and ``inc``.

One process keeps its metrics in a private registry. Under ``--workers N``
the supervisor creates a directory, names it in ``PROMETHEUS_MULTIPROC_DIR``
before starting the workers, marks a worker dead when it exits and removes
the directory at the end (:class:`MultiprocessDir`); each worker writes its
values to files there, and a scrape answered by any worker sums them all.
``prometheus_client`` picks its storage when first imported, so the
variable is set (or removed) before this module is imported in a worker.
"""

from __future__ import annotations

import bisect
import logging
import math
import os
import shutil
import tempfile

import gevent

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client import multiprocess
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from llmconn.errors import ConfigError
from llmconn.observe import Observer, RequestTally

logger = logging.getLogger(__name__)

MULTIPROC_ENV = 'PROMETHEUS_MULTIPROC_DIR'
# The hooks add to plain dicts; the values (under --workers, memory-mapped files) are written at
# most this many seconds later, and before every scrape this process answers. A worker killed
# with SIGKILL loses at most this much of its counts; a stopping server flushes (close()).
FLUSH_INTERVAL = 1.0
OTHER_SERVICE = 'other'     # the label of a path that names no deployed service: keeps cardinality bounded
# Seconds. Provider calls and requests run from milliseconds to minutes (long generations).
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# Most chat calls find their lock free (0) or wait for one provider call.
LOCK_WAIT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics(Observer):
    """The metrics of this process (``multiprocess``: values shared through PROMETHEUS_MULTIPROC_DIR files)."""

    def __init__(self, multiprocess_dir: str = '', flush_interval: float = FLUSH_INTERVAL) -> None:
        disable_created_metrics()       # *_created series double the output and no dashboard reads them
        self.multiprocess_dir = multiprocess_dir
        self.registry = None if multiprocess_dir else CollectorRegistry()
        reg = self.registry
        self.requests = Counter('llmconn_requests', 'HTTP requests served', ['service', 'status'], registry=reg)
        self.request_seconds = Histogram('llmconn_request_duration_seconds', 'Whole HTTP request, until its '
                                         'last byte', ['service'], buckets=LATENCY_BUCKETS, registry=reg)
        self.provider_calls = Counter('llmconn_provider_calls', 'HTTP attempts to providers, by HTTP status '
                                      '(or timeout, unreachable)', ['connection', 'status'], registry=reg)
        self.retries = Counter('llmconn_provider_retries', 'Provider attempts that were retries',
                               ['connection'], registry=reg)
        self.provider_seconds = Histogram('llmconn_provider_call_duration_seconds', 'One provider attempt, until '
                                          'its answer (its headers, for a stream)', ['connection'],
                                          buckets=LATENCY_BUCKETS, registry=reg)
        self.errors = Counter('llmconn_call_errors', 'invoke/chat/stream calls that raised, by error class',
                              ['connection', 'error'], registry=reg)
        self.busy = Counter('llmconn_chat_busy', 'Chat calls that gave up waiting for the chat lock (ChatBusy)',
                            ['connection'], registry=reg)
        self.failovers = Counter('llmconn_failovers', 'Calls that moved on to a fallback connection, by the '
                                 'reason (timeout, unreachable, HTTP status)', ['connection', 'fallback', 'reason'],
                                 registry=reg)
        self.lock_seconds = Histogram('llmconn_lock_wait_seconds', 'Time chat calls waited for their chat lock',
                                      ['connection'], buckets=LOCK_WAIT_BUCKETS, registry=reg)
        self.input_tokens = Counter('llmconn_input_tokens', 'Input tokens, as the providers counted them',
                                    ['connection'], registry=reg)
        self.output_tokens = Counter('llmconn_output_tokens', 'Output tokens, as the providers counted them',
                                     ['connection'], registry=reg)
        self.cache_read_tokens = Counter('llmconn_cache_read_tokens', 'Input tokens read from the provider\'s '
                                         'prompt cache (part of the input tokens)', ['connection'], registry=reg)
        self.cache_write_tokens = Counter('llmconn_cache_write_tokens', 'Input tokens written to the provider\'s '
                                          'prompt cache (part of the input tokens)', ['connection'], registry=reg)
        self.reasoning_tokens = Counter('llmconn_reasoning_tokens', 'Output tokens spent on reasoning (part of '
                                        'the output tokens)', ['connection'], registry=reg)
        self.store_errors = Counter('llmconn_store_errors', 'Chat store failures, by redis exception class',
                                    ['error'], registry=reg)
        self.deployed = Gauge('llmconn_services_deployed', 'Services this host serves', registry=reg,
                              multiprocess_mode='livemostrecent')
        self._bounds = {metric: (*buckets, math.inf) for metric, buckets in (
            (self.request_seconds, LATENCY_BUCKETS), (self.provider_seconds, LATENCY_BUCKETS),
            (self.lock_seconds, LOCK_WAIT_BUCKETS))}
        self._children: dict[tuple, object] = {}
        self._counts: dict[tuple, float] = {}       # (counter, labels) -> added since the last flush
        self._observed: dict[tuple, list] = {}      # (histogram, labels) -> [sum, count per bucket]
        # The flusher runs in the hub of the thread that made the metrics: the server's main thread,
        # where every request (and so every hook) runs.
        self._flusher = gevent.spawn(self._flush_every, flush_interval)

    def _child(self, metric, *labels: str):
        """``metric.labels(*labels)``, remembered: the library's own lookup takes a lock and builds a tuple."""
        key = (id(metric),) + labels
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    # -- the observer hooks: plain additions, written to the values in batches ----------------

    def provider_call(self, connection: str, status: str, seconds: float, retry: bool) -> None:
        self._inc(self.provider_calls, (connection, status))
        self._observe(self.provider_seconds, (connection,), seconds)
        if retry:
            self._inc(self.retries, (connection,))

    def lock_waited(self, connection: str, seconds: float) -> None:
        self._observe(self.lock_seconds, (connection,), seconds)

    def store_error(self, error: str) -> None:
        self._inc(self.store_errors, (error,))

    def call_done(self, connection: str, input_tokens: int, output_tokens: int, usage: dict | None = None) -> None:
        if input_tokens:
            self._inc(self.input_tokens, (connection,), input_tokens)
        if output_tokens:
            self._inc(self.output_tokens, (connection,), output_tokens)
        if usage:
            for metric, key in ((self.cache_read_tokens, 'cache_read_tokens'),
                                (self.cache_write_tokens, 'cache_write_tokens'),
                                (self.reasoning_tokens, 'reasoning_tokens')):
                if usage.get(key):
                    self._inc(metric, (connection,), usage[key])

    def call_failed(self, connection: str, error: str) -> None:
        self._inc(self.errors, (connection, error))

    def chat_busy(self, connection: str) -> None:
        self._inc(self.busy, (connection,))

    def failover(self, connection: str, fallback: str, reason: str) -> None:
        self._inc(self.failovers, (connection, fallback, reason))

    def request_done(self, tally: RequestTally) -> None:
        service = tally.service or OTHER_SERVICE
        self._inc(self.requests, (service, str(tally.status)))
        self._observe(self.request_seconds, (service,), tally.duration)

    def _inc(self, metric: Counter, labels: tuple, amount: float = 1) -> None:
        key = (metric, labels)
        counts = self._counts
        counts[key] = counts.get(key, 0) + amount

    def _observe(self, metric: Histogram, labels: tuple, amount: float) -> None:
        key = (metric, labels)
        entry = self._observed.get(key)
        if entry is None:
            entry = self._observed[key] = [0.0] + [0] * len(self._bounds[metric])
        entry[0] += amount
        entry[1 + bisect.bisect_left(self._bounds[metric], amount)] += 1      # le: the first bound >= amount

    # -- the values ------------------------------------------------------------------------------

    def flush(self) -> None:
        """Write what the hooks added since the last flush to the values (the files, under multiprocess).

        Each touched series is written once per flush, whatever the number of
        calls: one ``inc`` per counter, and per histogram its sum and each
        bucket that moved (``Histogram.observe`` would write two values per
        observation).
        """
        counts, self._counts = self._counts, {}
        observed, self._observed = self._observed, {}
        for (metric, labels), amount in counts.items():
            self._child(metric, *labels).inc(amount)
        for (metric, labels), (total, *buckets) in observed.items():
            child = self._child(metric, *labels)
            child._sum.inc(total)
            for i, count in enumerate(buckets):
                if count:
                    child._buckets[i].inc(count)

    def close(self) -> None:
        """Stop flushing and flush: the server is stopping."""
        self._flusher.kill(block=False)
        self.flush()

    def _flush_every(self, seconds: float) -> None:
        while True:
            gevent.sleep(seconds)
            try:
                self.flush()
            except Exception:       # what this batch had left is lost; the flusher keeps running
                logger.exception('Could not write the metrics\' values')

    # -- the scrape ------------------------------------------------------------------------------

    def render(self, services_deployed: int) -> tuple[bytes, str]:
        """The text exposition of every metric (all workers' under multiprocess) and its content type."""
        self.flush()
        self.deployed.set(services_deployed)
        registry = self.registry
        if registry is None:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=self.multiprocess_dir)
        return generate_latest(registry), CONTENT_TYPE_LATEST


class MultiprocessDir:
    """The supervisor's side of ``--workers N``: the shared directory, from creation to removal.

    Created fresh (inside an operator's own PROMETHEUS_MULTIPROC_DIR when one
    is set, e.g. a tmpfs), so no earlier run's values are ever summed in.
    """

    def __init__(self) -> None:
        parent = os.environ.get(MULTIPROC_ENV) or None
        try:
            self.path = tempfile.mkdtemp(prefix='llmconn-metrics-', dir=parent)
        except OSError as e:
            raise ConfigError(f'cannot create the workers\' metrics directory in {MULTIPROC_ENV}={parent} '
                              f'({e.strerror}); create that directory, make it writable, or unset the variable '
                              f'(or run with --no-metrics)') from None

    def env(self) -> dict:
        """The environment of a worker."""
        return dict(os.environ, **{MULTIPROC_ENV: self.path})

    def worker_exited(self, pid: int) -> None:
        """Its counters stay (they happened); its live gauges go."""
        multiprocess.mark_process_dead(pid, self.path)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def respond(app, environ: dict) -> tuple:
    """``GET /metrics`` of the WSGI app: (status, headers, body).

    Who may read it, as an operator would want: when the server requires API
    keys, so does /metrics (it names services and connections), but a
    scraper should not hold a key that can spend tokens and read chats, so
    ``LLMCONN_METRICS_KEY`` (an environment variable, never a flag: flags show
    in ``ps``) is a second key that opens /metrics and nothing else; set
    alone, it protects /metrics of a server that has no API keys. With
    neither, /metrics is as open as the rest of the server.
    """
    from llmconn.logs import METRICS_KEY_ENV
    from llmconn.observe import installed
    from llmconn.responses import HTTPFailure

    app._check_api_key(environ, extra=(os.environ.get(METRICS_KEY_ENV, ''),))
    observer = installed()
    if not isinstance(observer, Metrics):
        raise HTTPFailure(404, 'metrics are off on this server (--no-metrics); start it without that flag')
    body, content_type = observer.render(len(app.host.deployer.services))
    return 200, [('Content-Type', content_type), ('Content-Length', str(len(body)))], [body]
