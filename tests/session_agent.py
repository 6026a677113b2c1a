"""A tiny agent platform that keeps each conversation in a session, for the session-agent template.

    POST /run  {"agent": str, "session_id": str (absent: a new session), "input": str, "instructions": str}
    200        {"session_id": str, "reply": str, "usage": {"prompt_tokens": n, "completion_tokens": m}}
    404        {"error": "session ... not found"}

The reply is the fake providers' echo (``reply_text``) over the session's user
messages, so a test reads from it what the agent remembered. ``received``
records every request body.
"""

from __future__ import annotations

import json
import socket
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from llmconn.testing.fake_common import count_words, reply_text


class SessionAgent(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(('127.0.0.1', 0), _Handler)
        self.sessions: dict[str, list[str]] = {}
        self.received: list = []
        self.guard = threading.Lock()
        self.url = f'http://127.0.0.1:{self.server_address[1]}'

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().server_bind()

    def start(self) -> 'SessionAgent':
        threading.Thread(target=self.serve_forever, kwargs={'poll_interval': 0.01}, daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()

    def answer(self, body: dict) -> tuple[int, dict]:
        with self.guard:
            self.received.append(body)
            session_id = body.get('session_id')
            if session_id is None:
                session_id = f'sess_{uuid.uuid4().hex[:12]}'
                self.sessions[session_id] = []
            elif session_id not in self.sessions:
                return 404, {'error': f'session {session_id} not found'}
            users = self.sessions[session_id]
            users.append(body['input'])
            text = reply_text(users, bool(body.get('instructions')))
            usage = {'prompt_tokens': count_words(*users), 'completion_tokens': count_words(text)}
            return 200, {'session_id': session_id, 'reply': text, 'usage': usage}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get('content-length', 0)))
        status, answer = self.server.answer(json.loads(raw))
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header('content-type', 'application/json')
        self.send_header('content-length', str(len(data)))
        self.end_headers()
        self.wfile.write(data)
