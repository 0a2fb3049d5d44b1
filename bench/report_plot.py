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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(name for _, p in kinds for name, _ in p))
    colours = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(10, 1.5 + 0.6 * len(kinds)))
    for y, (_, p) in enumerate(kinds):
        left = 0.0
        for name, seconds in p:
            ax.barh(y, seconds, left=left, color=colours(names.index(name) % 20), height=0.6)
            left += seconds
    for name in names:
        ax.barh(0, 0, color=colours(names.index(name) % 20), label=name)
    if (goal := goal_s()) is not None:
        ax.axvline(goal, color="black", linestyle="--", linewidth=1)
        ax.text(
            goal,
            1.02,
            f"goal {goal:g} s",
            transform=ax.get_xaxis_transform(),
            ha="center",
            fontsize=8,
        )
    # the bars start at the fault: a hang's bar holds its detection too
    ax.set_yticks(range(len(kinds)), [k.replace(" (after detection)", "") for k, _ in kinds])
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the fault (medians of each phase, local pod)")
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(k for _, s in found for k, _ in s))
    colours = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(10, 1.4 + 0.6 * len(found)))
    for y, (_, s) in enumerate(found):
        left = 0.0
        for name, pct in s:
            ax.barh(y, pct, left=left, height=0.6, color=colours(names.index(name) % 10),
                    label=name if y == 0 else None)  # fmt: skip
            if pct >= 0.4:
                ax.text(left + pct / 2, y, f"{pct:g}", ha="center", va="center", fontsize=7)
            left += pct
    goal = [r.threshold for r in rules.RULES if r.key == bench]
    if goal and isinstance(goal[0], float):
        allowance = 100.0 - goal[0]
        ax.axvline(allowance, color="black", linestyle="--", linewidth=1)
        ax.text(allowance, 1.02, f"goal: <= {allowance:g} % badput", fontsize=8, ha="center",
                transform=ax.get_xaxis_transform())  # fmt: skip
    ax.set_yticks(range(len(found)), [label for label, _ in found])
    ax.invert_yaxis()
    ax.set_xlabel("% of the wall time (medians over the runs, Google's categories)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return png
