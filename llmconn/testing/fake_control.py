"""A handle on a fake provider running in a subprocess, driven over its ``/_fake/`` control API.

Tests that start several OS processes share one fake provider this way:
every process points at ``handle.url``, and the test reads what was sent
with ``handle.requests()`` and injects faults with ``handle.fail(...)``.
"""

from __future__ import annotations

import subprocess
from typing import Any

import requests as mod_requests

# How long stop() waits for the subprocess to exit after SIGTERM before killing it.
STOP_TIMEOUT = 5.0
CONTROL_TIMEOUT = 10.0
READY_PREFIX = 'fake provider listening on '


class FakeProviderProcess:
    """A fake provider subprocess: ``.url``, ``.stop()`` and the control API as methods."""

    def __init__(self, process: subprocess.Popen, url: str) -> None:
        self.process = process
        self.url = url
        self.port = int(url.rsplit(':', 1)[1])
        self._session = mod_requests.Session()

    @classmethod
    def from_process(cls, process: subprocess.Popen) -> 'FakeProviderProcess':
        """Wait for the subprocess to print its address, then wrap it."""
        line = process.stdout.readline() if process.stdout else ''
        if not line.startswith(READY_PREFIX):
            process.kill()
            process.wait()
            raise RuntimeError(f'fake provider subprocess did not start (exit code {process.returncode}, '
                               f'said {line!r}); run "python -m llmconn.testing.fake_server" to see why')
        return cls(process, line[len(READY_PREFIX):].strip())

    def __repr__(self) -> str:
        return f'<FakeProviderProcess {self.url} pid={self.process.pid}>'

    def __enter__(self) -> 'FakeProviderProcess':
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def stop(self) -> None:
        self._session.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout:
            self.process.stdout.close()

    def _control(self, method: str, name: str, body: Any = None) -> Any:
        response = self._session.request(method, f'{self.url}/_fake/{name}', json=body,
                                         timeout=CONTROL_TIMEOUT)
        response.raise_for_status()
        return response.json()

    def requests(self) -> list[dict]:
        """The recorded provider requests, oldest first."""
        return self._control('GET', 'requests')

    @property
    def violations(self) -> list[dict]:
        return self._control('GET', 'violations')

    def clear(self) -> None:
        self._control('DELETE', 'requests')

    def fail(self, status: int, count: int = 1, body: Any = None, headers: dict | None = None) -> None:
        self._control('POST', 'faults', {'status': status, 'count': count, 'body': body, 'headers': headers})

    def hang(self, seconds: float, count: int = 1) -> None:
        self._control('POST', 'faults', {'hang': seconds, 'count': count})

    def garbage(self, count: int = 1) -> None:
        self._control('POST', 'faults', {'garbage': True, 'count': count})

    def fail_stream(self, kind: str, count: int = 1) -> None:
        """``break`` or ``error`` the next ``count`` streams after their first delta."""
        self._control('POST', 'faults', {f'stream_{kind.replace("stream_", "")}': True, 'count': count})

    def clear_faults(self) -> None:
        self._control('DELETE', 'faults')

    def set_latency(self, seconds: float) -> None:
        self._control('POST', 'latency', {'seconds': seconds})
