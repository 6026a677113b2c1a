"""What a call cost, from a connection's ``pricing`` (SPEC §17): integer micro-USD.

Prices are USD per million tokens, so a count of tokens times its price is
micro-USD exactly: no float sums drift in the ledger, and a call's cost is
its tokens at four prices - the input the cache did not serve, what it wrote,
what it read, and the output (reasoning included: it is billed as output).
"""

from __future__ import annotations

from typing import Mapping

from llmconn.config import Pricing


def cost_micro_usd(pricing: Pricing | None, usage: Mapping) -> int:
    """The cost of ``usage`` (a result's usage dict) at ``pricing``; 0 without pricing."""
    if pricing is None:
        return 0
    read, written = usage.get('cache_read_tokens') or 0, usage.get('cache_write_tokens') or 0
    uncached = max(0, (usage.get('input_tokens') or 0) - read - written)
    return round(uncached * pricing.input + written * pricing.write_price + read * pricing.read_price
                 + (usage.get('output_tokens') or 0) * pricing.output)
