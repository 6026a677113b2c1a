"""Throughput against LiteLLM's proxy doing the same job: one OpenAI connection behind a gateway key.

One run starts its own redis-server (a free port, never the machine's), the
fake provider in a subprocess, ``llmconn serve --workers N`` with the gateway
on, and LiteLLM's proxy (``litellm --num_workers N``, no database, callbacks
and retries off, logging at WARNING as ``llmconn serve --log-level WARNING``)
with one model pointed at the same fake provider. Both answer the same body
on ``POST /v1/chat/completions``, non-streaming:

    direct     POST {fake}/v1/chat/completions        (what both gateways send on)
    llmconn    POST {llmconn}/v1/chat/completions
    litellm    POST {litellm}/v1/chat/completions

The load is closed-loop: ``wrk`` (C, one thread, keep-alive) holds C
connections, each asking again as soon as it has its answer, for a fixed
time. Blocks of the three targets alternate, in reverse order every other
round, so drift on a shared machine hits all of them; a target's figures are
over all its blocks. CPU per request is read from /proc for each server's
process tree during its own blocks: that figure does not depend on how busy
the machine's cores were, unlike req/s.

    .venv/bin/python bench/bench_litellm.py [--quick] [--workers N] [--clients C]

``make bench`` installs LiteLLM in its own virtualenv (.venv-bench-litellm)
and ``wrk`` must be on PATH (``apt-get install wrk``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from common import free_port, start_redis, write_gateway_config
from llmconn.demo import start_server, wait_until_up
from llmconn.testing.fake_server import FakeProviderServer

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LITELLM = ROOT / '.venv-bench-litellm' / 'bin' / 'litellm'
LLMCONN_KEY = 'sk-bench-llmconn-key'
LITELLM_KEY = 'sk-bench-litellm-key'
MODEL = 'Chat'
UPSTREAM_MODEL = 'gpt-4.1'
QUESTION = [{'role': 'user', 'content': 'hello gateway'}]
TARGETS = ('direct', 'llmconn', 'litellm')
LITELLM_START_TIMEOUT = 240.0   # seconds; its workers import a large package tree
DRAIN_TIMEOUT = 20.0            # seconds a server gets to finish the requests a block left in flight
DRAIN_IDLE = 0.025              # CPU seconds per 0.2 s (all trees) below which the servers count as idle
STOP_TIMEOUT = 20.0             # seconds a process group gets after SIGTERM before SIGKILL
WRK_GRACE = 30.0                # seconds past its duration before wrk is killed
# The latency quantiles (%) wrk reports per block: every 1 %, every 0.5 % around the median and
# every 0.05 % above 97 %, enough to merge blocks' p50 and p99. wrk finds each by scanning its
# histogram up to that latency, so the grid is kept small: the scan is CPU that wrk spends after
# its block (counted in its CPU column) instead of during it.
# (wrk answers 0 for 100 %, so the top is its maximum.)
GRID = sorted({*range(1, 100), *(p / 2 for p in range(80, 121)), *(p / 20 for p in range(1940, 2000))})
RATIO_TARGET = 3.0
THROUGHPUT_CLIENTS = 50

WRK_SCRIPT = '''
wrk.method = "POST"
wrk.body = {body}
wrk.headers["Content-Type"] = "application/json"
{auth}
function done(summary, latency, requests)
  local f = assert(io.open({out}, "w"))
  local e = summary.errors
  f:write(string.format("requests %d\\nduration_us %d\\nstatus %d\\nsocket %d\\n", summary.requests,
    summary.duration, e.status, e.connect + e.read + e.write + e.timeout))
  for _, p in ipairs({{{grid}}}) do f:write(string.format("q %s %d\\n", p, latency:percentile(p))) end
  f:write(string.format("q 100 %d\\n", latency.max))
  f:close()
end
'''


class Abort(RuntimeError):
    """The run cannot go on; the message says why."""


def lua_string(text: str) -> str:
    """``text`` as a Lua string literal (JSON's escapes are valid Lua ones for this ASCII text)."""
    return json.dumps(text)


def write_wrk_script(tmp: Path, name: str, body: dict, key: str | None) -> tuple[Path, Path]:
    """The Lua script that makes wrk post ``body`` and write its figures; and where it writes them."""
    out = tmp / f'wrk-{name}.out'
    auth = f'wrk.headers["Authorization"] = {lua_string("Bearer " + key)}' if key else ''
    script = tmp / f'wrk-{name}.lua'
    script.write_text(WRK_SCRIPT.format(body=lua_string(json.dumps(body)), auth=auth, out=lua_string(str(out)),
                                        grid=', '.join(f'{p:g}' for p in GRID)))
    return script, out


def write_llmconn_config(tmp: Path, fake_url: str, redis_url: str) -> Path:
    """One OpenAI connection at the fake provider and one gateway key, as the README's gateway shows."""
    return write_gateway_config(tmp, fake_url, redis_url, key=LLMCONN_KEY, name=MODEL, model=UPSTREAM_MODEL)


def write_litellm_config(tmp: Path, fake_url: str) -> Path:
    """The same model for LiteLLM: no database, no callbacks, no retries (its own benchmark's settings)."""
    config = tmp / 'litellm.yaml'
    config.write_text(f'''
model_list:
  - model_name: {MODEL}
    litellm_params:
      model: openai/{UPSTREAM_MODEL}
      api_base: "{fake_url}/v1"
      api_key: sk-fake-provider
litellm_settings:
  callbacks: []
  num_retries: 0
  request_timeout: 30
  set_verbose: false
general_settings:
  master_key: {LITELLM_KEY}
''')
    return config


def litellm_env() -> dict:
    """LiteLLM's environment: no database or key of the caller's, the bundled model map, quiet logs."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(('LITELLM_', 'OPENAI_')) and k not in ('DATABASE_URL', 'NUM_WORKERS')}
    env.update(LITELLM_LOCAL_MODEL_COST_MAP='True', LITELLM_LOG='WARNING')
    return env


def litellm_version(exe: Path) -> str:
    python = exe.parent / 'python'
    answer = subprocess.run([str(python), '-c', 'import importlib.metadata as m; print(m.version("litellm"))'],
                            capture_output=True, text=True, timeout=60)
    return answer.stdout.strip() or 'unknown version'


def start_litellm(exe: Path, config: Path, port: int, workers: int, log: Path) -> subprocess.Popen:
    """LiteLLM's proxy in a process group of its own; returns once it answers its liveness probe."""
    with log.open('wb') as out:
        proc = subprocess.Popen([str(exe), '--config', str(config), '--host', '127.0.0.1', '--port', str(port),
                                 '--num_workers', str(workers)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=litellm_env(), cwd=config.parent,
                                start_new_session=True)
    try:
        wait_until_up(f'http://127.0.0.1:{port}/health/liveliness', proc, timeout=LITELLM_START_TIMEOUT)
    except RuntimeError as exc:
        stop_group(proc)
        tail = log.read_text(errors='replace').strip().splitlines()[-15:]
        raise Abort(f'LiteLLM proxy did not start: {exc}\n  ' + '\n  '.join(tail)) from None
    except BaseException:
        stop_group(proc)
        raise
    return proc


def stop_group(proc: subprocess.Popen | None) -> None:
    """SIGTERM to the process group ``proc`` leads, a bounded wait, then SIGKILL to the group."""
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)   # workers the leader left behind, or a leader that hung
    except ProcessLookupError:
        pass
    proc.wait()


def ask(url: str, body: dict, key: str | None) -> str:
    """One request; the answer's text, or Abort with the status and a bit of the body."""
    headers = {'Content-Type': 'application/json', **({'Authorization': f'Bearer {key}'} if key else {})}
    request = urllib.request.Request(url, json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())['choices'][0]['message']['content']
    except urllib.error.HTTPError as exc:
        raise Abort(f'{url}: {exc.code} {exc.read()[:300]!r}') from None
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise Abort(f'{url}: no chat completion ({exc!r})') from None


# CPU accounting from /proc

def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()
    except OSError:
        return None


def process_trees(roots: dict) -> dict:
    """For each name, the pids of the process tree under its root pid (root included)."""
    children: dict = {}
    for entry in Path('/proc').iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))):
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    trees = {}
    for name, root in roots.items():
        pids, todo = [], [root]
        while todo:
            pid = todo.pop()
            pids.append(pid)
            todo.extend(children.get(pid, ()))
        trees[name] = pids
    return trees


def cpu_seconds(roots: dict) -> dict:
    """CPU time (user + system) each named process tree has used so far."""
    tick = os.sysconf('SC_CLK_TCK')
    totals = {}
    for name, pids in process_trees(roots).items():
        totals[name] = sum((int(f[11]) + int(f[12])) / tick for pid in pids if (f := _stat(pid)))
    return totals


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# Load

def run_wrk(url: str, script: Path, out: Path, clients: int, seconds: float) -> dict:
    """One closed-loop block: wrk's request count, duration, errors and latency quantiles (µs)."""
    out.unlink(missing_ok=True)
    argv = [shutil.which('wrk'), '-t1', f'-c{clients}', f'-d{seconds:g}s', '--timeout', '30s', '-s', str(script),
            url]
    before = children_cpu()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        _, err = proc.communicate(timeout=seconds + WRK_GRACE)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if proc.returncode != 0 or not out.exists():
        raise Abort(f'wrk failed on {url} (exit {proc.returncode}): {err.decode(errors="replace")[-300:]}')
    figures: dict = {'quantiles': [], 'wrk_cpu': children_cpu() - before}
    for line in out.read_text().splitlines():
        key, *values = line.split()
        if key == 'q':
            figures['quantiles'].append((float(values[0]), int(values[1])))
        else:
            figures[key] = int(values[0])
    return figures


def block_cdf(quantiles: list[tuple[float, int]], latency: int) -> float:
    """The share (0-1) of a block's requests at most ``latency`` µs, from its quantiles (a lower bound)."""
    return max((pct / 100 for pct, value in quantiles if value <= latency), default=0.0)


def merged_percentile(blocks: list[dict], pct: float) -> float:
    """The ``pct`` percentile (seconds) of all blocks' requests together, each block weighted by its count.

    The smallest latency among the blocks' quantiles at which the blocks' shares at or below it,
    weighted, reach ``pct``.
    """
    total = sum(block['requests'] for block in blocks)
    for latency in sorted({value for block in blocks for _, value in block['quantiles']}):
        share = sum(block['requests'] * block_cdf(block['quantiles'], latency) for block in blocks) / total
        if share >= pct / 100 - 1e-9:
            return latency / 1e6
    return max(value for block in blocks for _, value in block['quantiles']) / 1e6


def drain(roots: dict) -> dict:
    """Wait (bounded) until no tree uses CPU: the requests a block left in flight are done; the CPU then."""
    deadline = time.monotonic() + DRAIN_TIMEOUT
    last = cpu_seconds(roots)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = cpu_seconds(roots)
        if sum(now.values()) - sum(last.values()) < DRAIN_IDLE:
            return now
        last = now
    raise Abort(f'the servers still used CPU {DRAIN_TIMEOUT:g} s after a block ended')


def measure(targets: dict, roots: dict, clients: int, seconds: float, rounds: int, warmup: float) -> dict:
    """Each target's blocks at ``clients``, alternated; the CPU every tree used for each target's blocks.

    A block ends with ``clients`` requests in flight, which the server finishes after wrk has
    gone: the CPU until it is idle again is counted with the block (and those requests with its
    requests, see :func:`summarise`), so it neither lands on the next target's block nor is lost.
    """
    for name, (url, script, out) in targets.items():
        run_wrk(url, script, out, clients, warmup)
        drain(roots)
    blocks: dict = {name: [] for name in targets}
    used: dict = {name: {tree: 0.0 for tree in roots} for name in targets}
    for index in range(rounds):
        order = list(targets) if index % 2 == 0 else list(reversed(targets))
        for name in order:
            url, script, out = targets[name]
            before = cpu_seconds(roots)
            block = run_wrk(url, script, out, clients, seconds)
            after = drain(roots)
            if block['status']:
                raise Abort(f'{name}: {block["status"]} of {block["requests"]} answers were not 2xx')
            if not block['requests']:
                raise Abort(f'{name}: no answer within a {seconds:g} s block at {clients} clients; '
                            f'try longer blocks (--seconds)')
            blocks[name].append(block)
            for tree in roots:
                used[name][tree] += after[tree] - before[tree]
    return {name: summarise(blocks[name], used[name], clients) for name in targets}


def summarise(blocks: list[dict], used: dict, clients: int) -> dict:
    """req/s and latency over the answered requests; CPU per request also over those left in flight."""
    requests = sum(block['requests'] for block in blocks)
    seconds = sum(block['duration_us'] for block in blocks) / 1e6
    served = requests + clients * len(blocks)
    per_request = {tree: cpu / served for tree, cpu in used.items()}
    per_request['wrk'] = sum(block['wrk_cpu'] for block in blocks) / requests
    return {'rps': requests / seconds, 'p50': merged_percentile(blocks, 50), 'p99': merged_percentile(blocks, 99),
            'requests': requests, 'socket_errors': sum(block['socket'] for block in blocks), 'cpu': per_request}


# The run

def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--quick', action='store_true', help='4 s blocks, 2 rounds')
    parser.add_argument('--workers', type=int, default=os.cpu_count() or 1,
                        help='worker processes of each server (default: the machine\'s cores)')
    parser.add_argument('--clients', type=int, default=THROUGHPUT_CLIENTS,
                        help=f'concurrent clients of the throughput figure (default {THROUGHPUT_CLIENTS})')
    parser.add_argument('--seconds', type=float, default=None, help='length of one block (default 10, quick 4)')
    parser.add_argument('--rounds', type=int, default=None, help='blocks per target and level (default 3, quick 2)')
    parser.add_argument('--litellm', type=Path, default=DEFAULT_LITELLM,
                        help=f'the litellm command (default {DEFAULT_LITELLM.relative_to(ROOT)})')
    args = parser.parse_args()
    if args.workers < 1 or args.clients < 1:
        parser.error('--workers and --clients must be at least 1')
    args.litellm = args.litellm.absolute()     # it runs in its temporary directory
    args.seconds = args.seconds or (4.0 if args.quick else 10.0)
    args.rounds = args.rounds or (2 if args.quick else 3)
    return args


def check_tools(args: argparse.Namespace) -> None:
    if not shutil.which('wrk'):
        raise Abort('wrk is not on PATH; install it (apt-get install wrk) to run this benchmark')
    if not os.access(args.litellm, os.X_OK):
        raise Abort(f'{args.litellm} not found; `make bench` installs LiteLLM into .venv-bench-litellm')


def _terminate(signum, frame) -> None:
    raise KeyboardInterrupt(f'signal {signum}')


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGTERM, _terminate)   # clean up on SIGTERM as on Ctrl-C,
    signal.signal(signal.SIGINT, _terminate)    # even when started in the background, where SIGINT is ignored
    redis_proc = fake = ours = theirs = tmp = None
    done = False
    try:
        check_tools(args)
        tmp = Path(tempfile.mkdtemp(prefix='bench-litellm-'))
        (tmp / 'services').mkdir()
        redis_proc, redis_url = start_redis()
        fake = FakeProviderServer.spawn()
        our_port, their_port = free_port(), free_port()
        ours = start_server(write_llmconn_config(tmp, fake.url, redis_url), tmp / 'services', our_port,
                            extra=['--workers', str(args.workers), '--log-level', 'WARNING'],
                            start_new_session=True)
        theirs = start_litellm(args.litellm, write_litellm_config(tmp, fake.url), their_port, args.workers,
                               tmp / 'litellm.log')
        targets, answers = {}, {}
        for name, url, body, key in (
                ('direct', fake.url, {'model': UPSTREAM_MODEL, 'messages': QUESTION}, None),
                ('llmconn', f'http://127.0.0.1:{our_port}', {'model': MODEL, 'messages': QUESTION}, LLMCONN_KEY),
                ('litellm', f'http://127.0.0.1:{their_port}', {'model': MODEL, 'messages': QUESTION}, LITELLM_KEY)):
            answers[name] = ask(f'{url}/v1/chat/completions', body, key)
            targets[name] = (f'{url}/v1/chat/completions', *write_wrk_script(tmp, name, body, key))
        if len(set(answers.values())) != 1:
            raise Abort(f'the targets do not give the same answer: {answers}')
        roots = {'llmconn': ours.pid, 'litellm': theirs.pid, 'provider': fake.process.pid, 'redis': redis_proc.pid}
        warmup = min(args.seconds, 3.0)
        levels = sorted({1, args.clients})
        rows = [(clients, measure(targets, roots, clients, args.seconds, args.rounds, warmup)) for clients in levels]
        print_table(rows, args, litellm_version(args.litellm))
        done = True
        return 0
    except (Abort, RuntimeError) as exc:    # RuntimeError: a server that did not start (llmconn.demo)
        where = f' (configurations and LiteLLM\'s log kept in {tmp})' if tmp else ''
        print(f'bench_litellm: {exc}{where}', file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print('bench_litellm: interrupted; stopping what it started', file=sys.stderr)
        return 130
    finally:
        stop_group(theirs)
        stop_group(ours)
        if fake is not None:
            fake.stop()
        if redis_proc is not None:
            redis_proc.kill()
            redis_proc.wait()
        if tmp is not None and done:
            shutil.rmtree(tmp, ignore_errors=True)


# The table

def print_table(rows: list, args: argparse.Namespace, version: str) -> None:
    """Each target's figures per level, then the target line and the per-core figures.

    ``server CPU`` is the CPU time of the gateway's own processes per request (for llmconn, the
    ``llmconn serve`` supervisor and workers; Redis, which only llmconn uses, is its own column);
    ``provider`` and ``wrk`` are the fake provider's and the load generator's, which compete for
    the same cores.
    """
    cores = os.cpu_count() or 1
    print(f'\nllmconn gateway vs LiteLLM proxy {version}: {args.workers} worker(s) each, fake provider, wrk '
          f'closed loop, {args.rounds} × {args.seconds:g} s blocks per target, {time.strftime("%Y-%m-%d %H:%M")}; '
          f'{cores} cores shared by wrk, the servers, the fake provider and Redis')
    print(f'{"clients":>7} {"target":>8} {"req/s":>8} {"p50 ms":>8} {"p99 ms":>8} {"+p50 ms":>8} '
          f'{"server CPU ms/req":>17} {"Redis":>6} {"provider":>8} {"wrk":>6} {"errors":>6}')
    for clients, result in rows:
        direct = result['direct']
        for name, fig in result.items():
            cpu = fig['cpu']
            server = f'{cpu[name] * 1000:17.3f}' if name in cpu else f'{"-":>17}'
            redis = f'{cpu["redis"] * 1000:6.3f}' if name == 'llmconn' else f'{"-":>6}'
            plus = f'{(fig["p50"] - direct["p50"]) * 1000:8.2f}' if name != 'direct' else f'{"-":>8}'
            print(f'{clients:>7} {name:>8} {fig["rps"]:8.0f} {fig["p50"] * 1000:8.2f} {fig["p99"] * 1000:8.2f} '
                  f'{plus} {server} {redis} {cpu["provider"] * 1000:8.3f} {cpu["wrk"] * 1000:6.3f} '
                  f'{fig["socket_errors"]:>6}')
    print()
    print_targets(rows, args, cores)


def print_targets(rows: list, args: argparse.Namespace, cores: int) -> None:
    """The issue's figures side by side, with met yes/NO where there is a target."""
    levels = dict(rows)
    loaded, single = levels[args.clients], levels[min(levels)]
    ours, theirs = loaded['llmconn'], loaded['litellm']
    ratio = ours['rps'] / theirs['rps']
    our_cpu = (ours['cpu']['llmconn'] + ours['cpu']['redis']) * 1000
    their_cpu = theirs['cpu']['litellm'] * 1000
    table = [
        (f'throughput at {args.clients} clients, {args.workers} worker(s)',
         f'{ours["rps"]:.0f}/s = {ratio:.2f} ×', f'{theirs["rps"]:.0f}/s', f'≥ {RATIO_TARGET:g} ×', None),
        (f'p99 at {args.clients} clients', f'{ours["p99"] * 1000:.1f} ms', f'{theirs["p99"] * 1000:.1f} ms',
         '≤ its p99', None),
        (f'  both: ≥ {RATIO_TARGET:g} × its req/s at ≤ its p99', '', '', '',
         ratio >= RATIO_TARGET and ours['p99'] <= theirs['p99']),
        ('median added latency, 1 client (p50 − direct)',
         f'{(single["llmconn"]["p50"] - single["direct"]["p50"]) * 1000:.2f} ms',
         f'{(single["litellm"]["p50"] - single["direct"]["p50"]) * 1000:.2f} ms', 'LiteLLM publishes 2 ms', None),
        (f'req/s per core ({cores} cores, shared)', f'{ours["rps"] / cores:.0f}', f'{theirs["rps"] / cores:.0f}',
         '', None),
        ('server CPU ms per request (llmconn: + Redis)', f'{our_cpu:.3f}', f'{their_cpu:.3f}', '', None),
        ('req/s per server CPU-second (1000 / CPU ms)', f'{1000 / our_cpu:.0f}', f'{1000 / their_cpu:.0f}', '',
         None),
    ]
    header = ('figure', 'llmconn', 'LiteLLM', 'target', 'met')
    widths = [max(len(str(row[i])) for row in table + [header]) for i in range(4)]
    print('  '.join(h.ljust(w) for h, w in zip(header, widths + [3])))
    for *cells, met in table:
        verdict = '' if met is None else ('yes' if met else 'NO')
        print('  '.join(str(v).ljust(w) for v, w in zip((*cells, verdict), widths + [3])))


if __name__ == '__main__':
    sys.exit(main())
