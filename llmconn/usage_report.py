"""Reading the usage ledger back: rows per day, connection, model and key, and a text table.

The ledger's hashes are found by SCAN (on every master of a cluster, see
:func:`llmconn.store.usage.read_hashes`) and summed across slots; see
:mod:`llmconn.usage_keys` for their layout. This is what ``llmconn usage`` prints and ``GET /admin`` charts.
"""

from __future__ import annotations

import datetime as mod_datetime
import re
from base64 import urlsafe_b64decode
from collections import defaultdict
from functools import partial
from typing import Any

from llmconn.errors import InvalidInput
from llmconn.store.usage import read_hashes
from llmconn.usage_keys import COUNTERS, ERROR_PREFIX, USAGE_PREFIX

_COLUMNS = (('day', 'DAY'), ('connection', 'CONNECTION'), ('model', 'MODEL'), ('calls', 'CALLS'),
            ('errors', 'ERRORS'), ('input_tokens', 'INPUT'), ('cache_read_tokens', 'CACHE_READ'),
            ('cache_write_tokens', 'CACHE_WRITE'), ('output_tokens', 'OUTPUT'), ('reasoning_tokens', 'REASONING'),
            ('tool_calls', 'TOOLS'), ('cost', 'COST_USD'))


def decode(value: str) -> str:
    """The inverse of :func:`llmconn.store.keys.encode`."""
    raw = urlsafe_b64decode(value + '=' * (-len(value) % 4))
    return raw.decode('utf-8', 'surrogatepass')


_DAY = re.compile(r'\d{4}-\d{2}-\d{2}', re.ASCII)


def parse_day(text: str) -> str:
    """A ``--since`` value (YYYY-MM-DD) checked and normalized, or InvalidInput saying what to send."""
    text = text.strip()
    try:
        if not _DAY.fullmatch(text):        # fromisoformat also takes 20260131 and week dates
            raise ValueError(text)
        return mod_datetime.date.fromisoformat(text).isoformat()
    except ValueError:
        raise InvalidInput(f'{text!r} is not a date; write it as YYYY-MM-DD (UTC), e.g. 2026-01-31') from None


def read_usage(store: Any, *, since: str = '', connection: str = '') -> list[dict]:
    """Every ledger row from day ``since`` on (all when empty), of ``connection`` (all when empty).

    Rows are sorted by day, connection, model, key; each has the counters of
    :data:`llmconn.usage.COUNTERS` and ``errors_by_status``.
    """
    totals: dict[tuple, dict] = {}
    for key, fields in read_hashes(store, USAGE_PREFIX + '*', partial(_a_day_from, since)):
        _add_hash(totals, key.rsplit(':', 1)[1], fields, connection)
    return [totals[k] for k in sorted(totals)]


def _a_day_from(since: str, key: str) -> bool:
    """A day's hash (not a batch marker), of day ``since`` or later."""
    day = key.rsplit(':', 1)[1]
    return ':batch:' not in key and len(day) == 10 and day >= since


def _add_hash(totals: dict, day: str, fields: dict, connection: str) -> None:
    for field, value in fields.items():
        parts = field.split(':', 3)
        if len(parts) != 4:
            continue
        conn, model, key, counter = decode(parts[0]), decode(parts[1]), decode(parts[2]), parts[3]
        if connection and conn != connection:
            continue
        row = totals.get((day, conn, model, key))
        if row is None:
            row = totals[(day, conn, model, key)] = {'day': day, 'connection': conn, 'model': model, 'key': key,
                                                     **{c: 0 for c in COUNTERS}, 'errors_by_status': {}}
        if counter.startswith(ERROR_PREFIX):
            status = counter[len(ERROR_PREFIX):]
            row['errors_by_status'][status] = row['errors_by_status'].get(status, 0) + int(value)
        elif counter in row:
            row[counter] += int(value)


def by_connection_and_day(rows: list[dict]) -> dict[str, dict[str, dict]]:
    """connection -> day -> summed counters (models and keys added up), for charts."""
    out: dict[str, dict[str, dict]] = defaultdict(dict)
    for row in rows:
        day = out[row['connection']].setdefault(row['day'], {c: 0 for c in COUNTERS})
        for c in COUNTERS:
            day[c] += row[c]
    return dict(out)


def errors_by_status(rows: list[dict]) -> list[tuple[str, str, int]]:
    """(connection, status, count) for every error counted, most frequent first."""
    counts: dict[tuple, int] = defaultdict(int)
    for row in rows:
        for status, n in row['errors_by_status'].items():
            counts[(row['connection'], status)] += n
    return sorted(((c, s, n) for (c, s), n in counts.items()), key=lambda t: (-t[2], t[0], t[1]))


def _cell(name: str, value: Any) -> str:
    # The ledger keeps cost in micro-USD, exactly: shown as dollars with every digit.
    return f'{value / 1_000_000:.6f}' if name == 'cost' and value != '' else str(value)


def format_table(rows: list[dict]) -> str:
    """Rows as an aligned text table with a total line; a KEY column only when a row has a key, and a
    FAILOVERS column (calls that moved on to a fallback, see llmconn.failover) only when one has any."""
    columns = list(_COLUMNS)
    if any(row['key'] for row in rows):
        columns.insert(3, ('key', 'KEY'))
    if any(row.get('failovers') for row in rows):
        columns.insert(columns.index(('errors', 'ERRORS')) + 1, ('failovers', 'FAILOVERS'))
    if not rows:
        return 'no usage recorded'
    total = {name: sum(row[name] for row in rows) if name in COUNTERS else '' for name, _ in columns}
    total['day'] = 'TOTAL'
    cells = [[title for _, title in columns]]
    cells += [[_cell(name, row[name]) for name, _ in columns] for row in rows + [total]]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    numeric = [name in COUNTERS for name, _ in columns]
    lines = ['  '.join(cell.rjust(w) if num else cell.ljust(w) for cell, w, num in zip(line, widths, numeric))
             .rstrip() for line in cells]
    return '\n'.join(lines)
