"""Cost of every stack in stacks/: $ per million tokens on spot against on-demand.

Measured here: goodput (bench.goodput_bench, on the local pod). Not measurable here: a TPU's
tokens/s, so it is ASSUMED as the MFU goal (0.5) x the catalog generation's peak x chips, over the
stack preset's FLOPs per token. The spot/on-demand ratio does not depend on that assumption:
ratio = (spot price / on-demand price) / goodput.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from bench import cost
from bench.report import Figure

REPO = Path(__file__).resolve().parents[1]
ASSUMED_MFU = 0.5


def stacks(root: Path = REPO / "stacks") -> list[dict]:
    out = []
    for path in sorted(root.glob("Pulumi.*.yaml")):
        config = (yaml.safe_load(path.read_text()) or {}).get("config", {})
        accel = config.get("tpupod:acceleratorType")
        if accel:
            out.append(
                {
                    "stack": path.stem.removeprefix("Pulumi."),
                    "accelerator": accel,
                    "preset": config.get("tpupod:preset", "350m"),
                }
            )
    return out


def flops_per_token(preset: str, generation: str | None) -> float:
    """The trainer's own count (trainer.model) for the preset, parameters from eval_shape."""
    import jax
    import jax.numpy as jnp

    from trainer.config import load_config, with_generation_batch
    from trainer.model import Transformer, count_params
    from trainer.model import flops_per_token as per_token

    cfg = with_generation_batch(load_config(preset), generation)
    tokens = jnp.zeros((1, cfg.seq_len), jnp.int32)
    shapes = jax.eval_shape(Transformer(cfg).init, jax.random.key(0), tokens)
    return per_token(cfg, count_params(shapes["params"]))


def run(goodput: float | None, goodput_label: str) -> dict:
    from infra.catalog import lookup
    from trainer.peak import PEAK_FLOPS

    rows = []
    prices = cost.load_prices()
    for st in stacks():
        acc = lookup(st["accelerator"])
        gen = acc.generation.name
        row = {**st, "generation": gen, "chips": acc.chips}
        if gen not in prices or gen not in PEAK_FLOPS:
            rows.append({**row, "error": f"no price or peak for {gen}"})
            continue
        fpt = flops_per_token(st["preset"], gen)
        tokens_per_s = ASSUMED_MFU * PEAK_FLOPS[gen] * acc.chips / fpt
        price = prices[gen]
        watcher = watcher_per_hour(prices)
        row.update(
            watcher_usd_per_hour=watcher,
            # the watcher VM runs on demand beside the slice: its share of the spot bill
            watcher_share_of_spot=watcher / (price["spot"] * acc.chips + watcher),
            flops_per_token=fpt,
            assumed_tokens_per_s=tokens_per_s,
            price_ratio=price["spot"] / price["on_demand"],
        )
        if goodput is not None:
            row.update(cost.compare(gen, acc.chips, tokens_per_s, goodput))
            row["cost_ratio"] = row["price_ratio"] / goodput
        rows.append(row)
    return {
        "goodput": goodput,
        "goodput_label": goodput_label,
        "assumed_mfu": ASSUMED_MFU,
        "prices_as_of": prices["as_of"],
        "rows": rows,
    }


def watcher_per_hour(prices: dict) -> float:
    """The watcher VM (machine + boot disk), 0 when the price table has none."""
    row = prices.get("watcher") or {}
    return float(row.get("vm_per_hour", 0.0)) + float(row.get("disk_per_hour", 0.0))


def figures(result: dict) -> list[Figure]:
    g, label = result["goodput"], result["goodput_label"]
    as_of = result["prices_as_of"]
    figs = []
    for row in result["rows"]:
        name = f"cost {row['stack']} ({row['preset']}): spot / on-demand per token"
        if "error" in row:
            figs.append(Figure(name, f"not run: {row['error']}"))
            continue
        if g is None:
            figs.append(Figure(name, f"not run: {label}"))
            continue
        figs.append(
            Figure(
                name,
                f"{row['cost_ratio']:.2f}x ({1 - row['cost_ratio']:.0%} saved)",
                note=f"price ratio {row['price_ratio']:.2f} (prices of {as_of}) / goodput {g:.1%} "
                f"({label})",
            )
        )
        if row.get("watcher_usd_per_hour"):
            figs.append(
                Figure(
                    f"cost {row['stack']}: watcher VM per hour",
                    f"${row['watcher_usd_per_hour']:.4f}/h "
                    f"({row['watcher_share_of_spot']:.2%} of the stack's spot bill)",
                    note=f"e2-small on demand + 10 GB disk, prices of {as_of}; "
                    "`tpupod:watcher: false` removes it",
                )
            )
        figs.append(
            Figure(
                f"cost {row['stack']} ({row['preset']}): $/Mtok spot vs on-demand",
                f"{row['spot_usd_per_mtok']:.3g} vs {row['on_demand_usd_per_mtok']:.3g}",
                "$/Mtok",
                note=f"ASSUMED: MFU {result['assumed_mfu']} of the {row['generation']} peak "
                f"({row['assumed_tokens_per_s']:.3g} tok/s on {row['chips']} chips), not measured; "
                f"goodput {g:.1%} ({label}); prices of {as_of}",
            )
        )
    return figs
