"""``GET /admin`` on ``llmconn serve``: usage, provider errors and a chat's history, as one HTML page.

Rendered on the server from the usage ledger and the chat store, with no
script and no build step: the chart is inline SVG. Everything that came
from outside (connection names, models, chat ids, chat text, error
statuses) goes through :func:`html.escape`, and the response forbids any
script by Content-Security-Policy as a second line of defence.

The page needs an API key, and is refused (403) when the host has none
configured: it shows conversations. Besides ``X-API-Key`` and ``Bearer``,
it accepts the key as the password of HTTP Basic authentication, so a
browser asks for it with its own login dialog (any user name).
"""

from __future__ import annotations

import datetime as mod_datetime
import hmac
import time as mod_time
from base64 import b64decode
from html import escape
from typing import Any
from urllib.parse import parse_qs

from llmconn.errors import LLMConnError
from llmconn.responses import HTTPFailure
from llmconn.usage_report import by_connection_and_day, errors_by_status, read_usage

DAYS_SHOWN = 14
MAX_QUERY_FIELDS = 10
CHART_WIDTH, CHART_HEIGHT, CHART_MARGIN = 760, 240, 40
COLORS = ('#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#edc948', '#b07aa1', '#ff9da7')
SECURITY_HEADERS = [
    ('Content-Security-Policy', "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                                "frame-ancestors 'none'"),
    ('X-Content-Type-Options', 'nosniff'), ('Cache-Control', 'no-store'), ('Referrer-Policy', 'no-referrer')]


def handle(app: Any, environ: dict, cid: str) -> tuple:
    """The page as (status, headers, body), or an HTTPFailure for the host to send (a route of wsgi.ROUTES)."""
    _authorize(app, environ)
    try:
        query = parse_qs(environ.get('QUERY_STRING', ''), max_num_fields=MAX_QUERY_FIELDS)
    except ValueError:
        raise HTTPFailure(400, f'the query has more than {MAX_QUERY_FIELDS} fields; /admin takes connection '
                               f'and chat_id') from None
    page = render(app.host.registry, (query.get('connection') or [''])[0], (query.get('chat_id') or [''])[0])
    body = page.encode('utf-8')
    return 200, [('Content-Type', 'text/html; charset=utf-8'), ('Content-Length', str(len(body)))] + \
        list(SECURITY_HEADERS), [body]


def _authorize(app: Any, environ: dict) -> None:
    keys = app._api_keys()
    if not keys:
        raise HTTPFailure(403, 'the admin page shows conversations, so it needs an API key, and none is '
                               'configured: set server.api_keys (e.g. LLMCONN_API_KEY) and restart')
    auth = environ.get('HTTP_AUTHORIZATION', '')
    if auth[:6].lower() == 'basic ':
        try:
            password = b64decode(auth[6:].strip(), validate=True).partition(b':')[2]
        except ValueError:
            password = b''
        matched = False
        for key in keys:        # every key, always: the time taken says nothing
            matched |= hmac.compare_digest(password, key)
        if matched:
            return
    else:
        try:
            app._check_api_key(environ)
            return
        except HTTPFailure:
            pass
    raise HTTPFailure(401, 'the admin page needs the API key: as the password of the login dialog, '
                           'or as X-API-Key / Authorization: Bearer',
                      [('WWW-Authenticate', 'Basic realm="llmconn admin", charset="UTF-8"')])


def render(registry: Any, connection: str, chat_id: str) -> str:
    """The whole page; a store that fails shows its error in place of the data."""
    days = _last_days(DAYS_SHOWN)
    try:
        rows = read_usage(registry.store, since=days[0])
        usage_error = ''
    except LLMConnError as e:
        rows, usage_error = [], str(e)
    sections = [
        _section('Usage per connection and day (tokens in + out, UTC)',
                 _notice(usage_error) or usage_chart(by_connection_and_day(rows), days) + usage_table(rows)),
        _section(f'Failed calls by status (the provider\'s, or the error that ended them), last {DAYS_SHOWN} days',
                 _notice(usage_error) or errors_table(rows)),
        _section('Gateway keys against their limits (this minute, this budget period)', limits_table(registry)),
        _section('Chat history', history_form(list(registry), connection, chat_id)
                 + (history_view(registry, connection, chat_id) if chat_id else '')),
    ]
    pending = registry.usage.pending() if registry.usage is not None else 0
    store = escape(registry.store.url_for_display)
    return f'''<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>llmconn admin</title>
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }}
table {{ border-collapse: collapse; margin: .5em 0; }}
th, td {{ border: 1px solid #ccc; padding: 2px 8px; text-align: left; }}
td.n {{ text-align: right; font-variant-numeric: tabular-nums; }}
.turn {{ border-left: 3px solid #ccc; padding: 2px 8px; margin: 6px 0; white-space: pre-wrap; }}
.user {{ border-color: #4e79a7; }} .assistant {{ border-color: #59a14f; }}
.notice {{ color: #a00; }}
</style></head>
<body>
<h1>llmconn admin</h1>
<p>Store <code>{store}</code> · {len(registry)} connection(s) · {pending} call(s) counted in this process
and not yet written</p>
{''.join(sections)}
</body></html>
'''


def usage_chart(series: dict[str, dict[str, dict]], days: list[str]) -> str:
    """Grouped bars: one group per day, one bar per connection, height = input + output tokens."""
    names = sorted(series)
    if not names:
        return '<p>No usage recorded in these days.</p>'
    tokens = {(n, d): series[n].get(d, {}).get('input_tokens', 0) + series[n].get(d, {}).get('output_tokens', 0)
              for n in names for d in days}
    top = max(max(tokens.values()), 1)
    plot_w, plot_h = CHART_WIDTH - 2 * CHART_MARGIN, CHART_HEIGHT - 2 * CHART_MARGIN
    group_w = plot_w / len(days)
    bar_w = max(group_w * 0.8 / len(names), 1)
    parts = [f'<svg id="usage-chart" xmlns="http://www.w3.org/2000/svg" width="{CHART_WIDTH}" '
             f'height="{CHART_HEIGHT}" role="img" aria-label="tokens per connection and day">',
             f'<text x="{CHART_MARGIN}" y="{CHART_MARGIN - 12}" font-size="11">max {top} tokens</text>',
             f'<line x1="{CHART_MARGIN}" y1="{CHART_MARGIN + plot_h}" x2="{CHART_MARGIN + plot_w}" '
             f'y2="{CHART_MARGIN + plot_h}" stroke="#888"/>']
    for i, day in enumerate(days):
        x0 = CHART_MARGIN + i * group_w + group_w * 0.1
        parts.append(f'<text x="{x0:.1f}" y="{CHART_MARGIN + plot_h + 14}" font-size="10">{day[5:]}</text>')
        for j, name in enumerate(names):
            value = tokens[(name, day)]
            calls = series[name].get(day, {}).get('calls', 0)
            h = plot_h * value / top
            parts.append(
                f'<rect class="bar" x="{x0 + j * bar_w:.1f}" y="{CHART_MARGIN + plot_h - h:.1f}" '
                f'width="{bar_w:.1f}" height="{h:.1f}" fill="{COLORS[j % len(COLORS)]}" '
                f'data-connection="{escape(name)}" data-day="{day}" data-tokens="{value}" data-calls="{calls}">'
                f'<title>{escape(name)} {day}: {value} tokens, {calls} calls</title></rect>')
    for j, name in enumerate(names):
        y = CHART_HEIGHT - 8
        x = CHART_MARGIN + j * 150
        parts.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{COLORS[j % len(COLORS)]}"/>'
                     f'<text x="{x + 14}" y="{y}" font-size="11">{escape(name[:20])}</text>')
    parts.append('</svg>')
    return ''.join(parts)


# The usage table's counters and their column titles; the cache and reasoning counts are parts of
# the input and output counts beside them.
TABLE_COUNTERS = (('calls', 'Calls'), ('errors', 'Errors'), ('input_tokens', 'Input'),
                  ('cache_read_tokens', 'Cache read'), ('cache_write_tokens', 'Cache write'),
                  ('output_tokens', 'Output'), ('reasoning_tokens', 'Reasoning'), ('tool_calls', 'Tool calls'))


def usd(micro: int) -> str:
    """Micro-USD as dollars, every digit kept (the ledger's cost is exact)."""
    return f'{micro / 1_000_000:.6f}'


def limits_table(registry: Any) -> str:
    """Each limited gateway key's use against its rpm, tpm and budget; a store that fails shows its error."""
    from llmconn.gateway.limits import report
    try:
        rows = report(registry)
    except LLMConnError as e:
        return _notice(str(e))
    if not rows:
        return '<p>No gateway key has limits.</p>'

    def of(used: Any, limit: Any, fmt: str = '{}') -> str:
        return escape(f'{fmt.format(used)} / {fmt.format(limit) if limit is not None else "-"}')
    body = ''.join(f'<tr><td>{escape(r["key"])}</td><td class="n">{of(r["requests"], r["rpm"])}</td>'
                   f'<td class="n">{of(r["tokens"], r["tpm"])}</td>'
                   f'<td class="n">{of(r["spent_usd"], r["budget_usd"], "{:.4f}")}</td>'
                   f'<td>{escape(r["period"])}</td></tr>' for r in rows)
    return ('<table id="limits-table"><tr><th>gateway key</th><th>requests / rpm</th><th>tokens / tpm</th>'
            f'<th>spent / budget (USD)</th><th>period</th></tr>{body}</table>')


def usage_table(rows: list[dict]) -> str:
    """One row per day, connection, model and gateway key; the Key column only when a row has a key, the
    Failovers column (calls of the connection that moved on to a fallback) only when one has any."""
    keyed = any(r['key'] for r in rows)
    counters = list(TABLE_COUNTERS)
    if any(r.get('failovers') for r in rows):
        counters.insert(counters.index(('errors', 'Errors')) + 1, ('failovers', 'Failovers'))
    head = '<tr><th>Day</th><th>Connection</th><th>Model</th>' + ('<th>Key</th>' if keyed else '') + \
           ''.join(f'<th>{title}</th>' for _, title in counters) + '<th>Cost (USD)</th></tr>'
    body = ''.join(
        f'<tr><td>{r["day"]}</td><td>{escape(r["connection"])}</td><td>{escape(r["model"])}</td>'
        + (f'<td>{escape(r["key"])}</td>' if keyed else '')
        + ''.join(f'<td class="n">{r.get(c, 0)}</td>' for c, _ in counters)
        + f'<td class="n">{usd(r.get("cost", 0))}</td></tr>' for r in reversed(rows))
    return f'<table id="usage-table">{head}{body}</table>'


def errors_table(rows: list[dict]) -> str:
    errors = errors_by_status(rows)
    if not errors:
        return '<p>No failed calls in these days.</p>'
    body = ''.join(f'<tr><td>{escape(c)}</td><td>{escape(s)}</td><td class="n">{n}</td></tr>' for c, s, n in errors)
    return f'<table id="errors-table"><tr><th>Connection</th><th>Status</th><th>Errors</th></tr>{body}</table>'


def history_form(names: list[str], connection: str, chat_id: str) -> str:
    options = ''.join(f'<option value="{escape(n)}"{" selected" if n == connection else ""}>{escape(n)}</option>'
                      for n in names)
    return (f'<form id="history-form" method="get" action="admin">'
            f'<label>Connection <select name="connection">{options}</select></label> '
            f'<label>Chat id <input name="chat_id" value="{escape(chat_id)}" size="40" maxlength="256"></label> '
            f'<button type="submit">Show history</button></form>')


def history_view(registry: Any, connection: str, chat_id: str) -> str:
    try:
        messages = registry[connection].history(chat_id)
    except LLMConnError as e:
        return _notice(str(e))
    if not messages:
        return f'<p id="history">No stored turns for chat <code>{escape(chat_id)}</code>.</p>'
    turns = ''.join(f'<div class="turn {m["role"]}"><b>{escape(m["role"])}</b>: {escape(str(m["content"]))}</div>'
                    for m in messages)
    return f'<div id="history"><p>{len(messages)} message(s) of <code>{escape(chat_id)}</code></p>{turns}</div>'


def _section(title: str, content: str) -> str:
    return f'<section><h2>{escape(title)}</h2>{content}</section>\n'


def _notice(message: str) -> str:
    return f'<p class="notice">{escape(message)}</p>' if message else ''


def _last_days(n: int) -> list[str]:
    today = mod_datetime.datetime.fromtimestamp(mod_time.time(), mod_datetime.timezone.utc).date()
    return [(today - mod_datetime.timedelta(days=i)).isoformat() for i in range(n - 1, -1, -1)]
