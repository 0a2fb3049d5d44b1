"""The recovery phases `bench recovery` recorded, as stacked bars per fault kind, for BENCHMARKS.md
(docs/benchmarks-recovery.png): drawn from the rows' recorded medians, nothing measured here."""

from __future__ import annotations

import re
from pathlib import Path

from bench import rules

ROW = re.compile(r"recovery phases, (.+) \(recovery run\)$")
PHASE = re.compile(r"\s*(.+?) (\d+(?:\.\d+)?)(?= \+|$)")


def phases(value: str) -> list[tuple[str, float]]:
    """ "detection 0.5 + save on notice + exit 1.7 + ... s (not separated: ...)" -> pairs."""
    text = str(value).split(" (not separated")[0].removesuffix(" s")
    return [(m.group(1).lstrip("+ "), float(m.group(2))) for m in PHASE.finditer(text)]


def goal_s() -> float | None:
    found = [r.threshold for r in rules.RULES if r.key.startswith("recovery-")]
    return float(found[0]) if found and isinstance(found[0], float) else None


def recovery_phases(rows: list[dict], png: Path) -> Path | None:
    """Draws `png` when the rows hold recovery phases; None (nothing drawn) when they do not."""
    kinds = [(m.group(1), phases(r["value"])) for r in rows if (m := ROW.match(r["name"]))]
    kinds = [(k, p) for k, p in kinds if p]
    if not kinds:
        return None
    goal = goal_s()
    # the bars start at the fault: a hang's bar holds its detection too
    bars = [(k.replace(" (after detection)", ""), p) for k, p in kinds]
    return stacked_bars(bars, png, "seconds from the fault (medians of each phase, local pod)",
                        goal, f"goal {goal:g} s" if goal is not None else "")  # fmt: skip


def stacked_bars(bars: list[tuple[str, list[tuple[str, float]]]], png: Path, xlabel: str,
                 goal: float | None = None, goal_text: str = "", values: bool = False) -> Path:  # fmt: skip
    """One horizontal bar per (label, [(part, width), ...]), the parts stacked in their order and
    coloured alike across bars, a dashed line at `goal`; `values` writes each wide part's width."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(name for _, parts in bars for name, _ in parts))
    colours = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(10, 1.5 + 0.6 * len(bars)))
    for y, (_, parts) in enumerate(bars):
        left = 0.0
        for name, width in parts:
            ax.barh(y, width, left=left, color=colours(names.index(name) % 20), height=0.6)
            if values and width >= 0.4:
                ax.text(left + width / 2, y, f"{width:g}", ha="center", va="center", fontsize=7)
            left += width
    for name in names:
        ax.barh(0, 0, color=colours(names.index(name) % 20), label=name)
    if goal is not None:
        ax.axvline(goal, color="black", linestyle="--", linewidth=1)
        ax.text(goal, 1.02, goal_text, transform=ax.get_xaxis_transform(), ha="center",
                fontsize=8)  # fmt: skip
    ax.set_yticks(range(len(bars)), [label for label, _ in bars])
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return png


BREAKDOWN = re.compile(r"badput breakdown, (.+?) \(.*\), medians$")
SHARE = re.compile(r"([a-z /]+?) (\d+(?:\.\d+)?) s \((\d+(?:\.\d+)?)%\)")


def shares(value: str) -> list[tuple[str, float]]:
    """ "productive 1270 s (94.8%), startup 20 s (1.5%), ..." -> [(category, % of wall), ...]."""
    return [(m.group(1).strip(), float(m.group(3))) for m in SHARE.finditer(str(value))]


def badput_shares(rows: list[dict], png: Path, bench: str) -> Path | None:
    """The goodput mix's median badput breakdown as one bar of % of the wall per category, the
    allowance its rule leaves (100 % - the goal) marked; None (nothing drawn) without a row."""
    found = [(m.group(1), shares(r["value"])) for r in rows if (m := BREAKDOWN.match(r["name"]))]
    found = [(label, [(k, v) for k, v in s if k != "productive"]) for label, s in found if s]
    if not found:
        return None
    goal = [r.threshold for r in rules.RULES if r.key == bench]
    allowance = 100.0 - goal[0] if goal and isinstance(goal[0], float) else None
    text = f"goal: <= {allowance:g} % badput" if allowance is not None else ""
    xlabel = "% of the wall time (medians over the runs, Google's categories)"
    return stacked_bars(found, png, xlabel, allowance, text, values=True)
