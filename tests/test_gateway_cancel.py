"""A client that leaves mid-stream: the provider's stream is closed and the response recorded ``cancelled``.

The backend here is a slow Chat Completions stream (one word every few
milliseconds, for far longer than the test runs) that notes when its
reader went away, so the test can see the gateway hung up on it.
"""

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gateway_stack import GatewayStack, gateway_usage, quiet_usage, settled_usage

WORDS = 5000                 # about 25 s of stream: the test never sees its end
WORD_PAUSE = 0.005
WAIT = 15.0                  # bound on waiting for the gateway to notice the client left


class SlowStream(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(('127.0.0.1', 0), _Handler)
        self.url = f'http://127.0.0.1:{self.server_address[1]}/v1'
        self.hung_up = threading.Event()
        self.sent = 0

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().server_bind()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get('content-length', 0)))
        self.send_response(200)
        self.send_header('content-type', 'text/event-stream')
        self.send_header('transfer-encoding', 'chunked')
        self.end_headers()
        try:
            for n in range(WORDS):
                chunk = {'id': 'chatcmpl-slow', 'object': 'chat.completion.chunk', 'created': 0, 'model': 'slow',
                         'choices': [{'index': 0, 'delta': {'content': f'w{n} '}, 'finish_reason': None}]}
                piece = f'data: {json.dumps(chunk)}\n\n'.encode()
                self.wfile.write(b'%x\r\n%s\r\n' % (len(piece), piece))
                self.wfile.flush()
                self.server.sent = n + 1
                time.sleep(WORD_PAUSE)
        except OSError:
            self.server.hung_up.set()


@pytest.fixture(scope='module')
def setup():
    slow = SlowStream()
    threading.Thread(target=slow.serve_forever, kwargs={'poll_interval': 0.01}, daemon=True).start()
    stack = GatewayStack(processes=1, extra_llm=f'''
  - {{name: Slow, provider: openai, model: slow, address: "{slow.url}", max_retries: 0}}''')
    yield stack, slow
    stack.close()
    slow.shutdown()
    slow.server_close()


def wait_for(condition, what: str):
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f'timed out waiting for {what}')


def test_a_client_that_leaves_cancels_the_response_and_closes_the_provider_stream(setup):
    stack, slow = setup
    slow.hung_up.clear()
    stream = stack.client().responses.create(model='Slow', input='go on forever', stream=True)
    seen = []
    for event in stream:
        seen.append(event)
        if event.type == 'response.output_text.delta' and len(seen) > 8:
            break
    stream.close()
    response_id = seen[0].response.id
    assert slow.hung_up.wait(WAIT), 'the gateway kept reading the provider after its client left'
    record = wait_for(lambda: (r := stack.record('a', response_id)) and r['status'] == 'cancelled' and r,
                      'the response to be recorded cancelled')
    usage = record['usage']
    assert usage['estimated'] is True and 0 < usage['output_tokens'] < WORDS
    assert slow.sent < WORDS
    streamed = ''.join(e.delta for e in seen if e.type == 'response.output_text.delta')
    assert record['output'][0]['content'][0]['text'].startswith(streamed)


def test_a_chat_completion_stream_the_client_leaves_is_counted_cancelled(setup):
    stack, slow = setup
    slow.hung_up.clear()
    stream = stack.client().chat.completions.create(model='Slow', messages=[{'role': 'user', 'content': 'go'}],
                                                    stream=True)
    for index, _ in enumerate(stream):
        if index > 5:
            break
    stream.close()
    assert slow.hung_up.wait(WAIT)

    def cancelled():
        usage = gateway_usage(stack, ('key-a', 'Slow'))
        return usage if usage.get('error:cancelled') else None

    usage = wait_for(cancelled, 'the cancelled completion to be counted')
    # The tokens it streamed count, estimated from the text (as the Responses route records them).
    assert usage['error:cancelled'] >= 1 and usage.get('output_tokens', 0) >= 1


def test_a_redis_outage_is_a_503_in_openai_shape_without_a_traceback():
    stack = GatewayStack(processes=1)
    try:
        first = stack.client().responses.create(model='Chat', input='before the outage')
        settled_usage(stack, ('key-a', 'Chat'), lambda u: u.get('calls', 0) >= 1)
        stack.redis_server.stop()
        import openai
        with pytest.raises(openai.InternalServerError) as failed:
            stack.client().responses.create(model='Chat', input='during', previous_response_id=first.id)
        assert failed.value.status_code == 503 and failed.value.body['code'] == 'store_unavailable'
        assert 'Traceback' not in failed.value.message
        stack.fake.clear()
        with pytest.raises(openai.InternalServerError):
            stack.client().responses.create(model='Chat', input='no state to write')
        with pytest.raises(openai.InternalServerError):
            stack.client().responses.create(model='Chat', input='nor streamed', stream=True)
        assert stack.fake.requests == []     # found before any token was spent
        # Chat Completions keep no state: they still answer, and their usage is counted once Redis is back.
        stack.client().chat.completions.create(model='Chat', messages=[{'role': 'user', 'content': 'still here'}])
        stack.redis_server.start()          # same port, empty: only what was kept in process can show up
        counts = settled_usage(stack, ('key-a', 'Chat'), lambda u: u.get('calls', 0) >= 1)
        assert counts.get('calls') == 1
        assert quiet_usage(stack, ('key-a', 'Chat')).get('calls') == 1      # once
    finally:
        stack.close()


def test_a_key_removed_from_the_configuration_stops_working_without_a_restart():
    import openai
    stack = GatewayStack(processes=1)
    try:
        client = stack.client('b')
        assert client.models.list().data
        text = stack.config.read_text()
        kept = [line for line in text.splitlines(keepends=True)]
        start = next(i for i, line in enumerate(kept) if 'id: key-b,' in line)
        stack.config.write_text(''.join(kept[:start] + kept[start + 2:]))   # the key is two lines

        def refused():
            try:
                client.models.list()
            except openai.AuthenticationError:
                return True
            return False

        assert wait_for(refused, 'the removed key to be refused')
        assert stack.client('a').models.list().data      # the others still work
    finally:
        stack.close()
