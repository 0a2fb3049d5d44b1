"""Cost: $ per million tokens on spot against on-demand, from the dated price table.

Spot capacity is cheaper per chip-hour but loses wall time to preemptions; measured goodput (the
productive share of wall time) converts one into the other: cost = price / (tokens/s * goodput).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

PRICES = Path(__file__).with_name("prices.toml")


def load_prices(path: Path = PRICES) -> dict:
    return tomllib.loads(path.read_text())


def dollars_per_million_tokens(
    price_per_chip_hour: float, chips: int, tokens_per_s: float, goodput: float
) -> float:
    if tokens_per_s <= 0 or not 0 < goodput <= 1:
        raise ValueError("tokens_per_s must be > 0 and goodput in (0, 1]")
    tokens_per_hour = tokens_per_s * 3600 * goodput
    return price_per_chip_hour * chips / tokens_per_hour * 1e6


def compare(generation: str, chips: int, tokens_per_s: float, spot_goodput: float) -> dict:
    """Spot (at the measured goodput) against on-demand (never preempted, goodput 1)."""
    prices = load_prices()
    if generation not in prices:
        known = ", ".join(k for k, v in prices.items() if isinstance(v, dict))
        raise ValueError(f"no price for {generation!r} in {PRICES.name}; known: {known}")
    row = prices[generation]
    spot = dollars_per_million_tokens(row["spot"], chips, tokens_per_s, spot_goodput)
    on_demand = dollars_per_million_tokens(row["on_demand"], chips, tokens_per_s, 1.0)
    return {
        "generation": generation,
        "chips": chips,
        "spot_usd_per_mtok": spot,
        "on_demand_usd_per_mtok": on_demand,
        "saving": 1 - spot / on_demand,
        "prices_as_of": prices["as_of"],
    }
