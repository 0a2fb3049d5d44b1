"""The goodput timeline: training step against wall time, with recovery events marked.

Input is what a run leaves behind: (time, step) samples of the trainers' progress and the watch
journal's events. Output is one PNG a person can read at a glance.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: no display on CI or TPU hosts
import matplotlib.pyplot as plt  # noqa: E402

# Journal event -> (colour, line style, legend label).
MARKS = {
    "preempt": ("tab:red", "-", "preemption (notice)"),
    "kill": ("darkred", "-", "kill (no notice)"),
    "hang": ("tab:purple", "-", "hang injected"),
    "crash": ("tab:brown", "-", "crash injected"),
    "detected": ("tab:orange", "--", "detected"),
    "resumed": ("tab:green", ":", "resumed"),
}


# Badput category -> colour of its share in the bar under the curve.
BADPUT_COLOURS = {
    "productive": "tab:green",
    "startup": "tab:olive",
    "restore": "tab:cyan",
    "compile": "tab:purple",
    "checkpoint save": "tab:orange",
    "lost progress": "tab:red",
    "recovery / infra": "tab:gray",
    "other": "0.8",
}


def plot(
    samples: list[tuple[float, int | None]],
    events: list[dict],
    out: Path,
    title: str,
    badput: dict[str, float] | None = None,
) -> Path:
    """Draw the step curve from `samples` (unix time, step; a None step breaks the line, e.g.
    between two trainer processes), a line per marked event and a band per detected -> resumed;
    with `badput` (seconds per category), a bar of the wall time's shares underneath."""
    if not samples:
        raise ValueError("no progress samples to plot")
    t0 = min(t for t, _ in samples)
    if badput:
        fig, (ax, bar) = plt.subplots(
            2, 1, figsize=(10, 5.4), dpi=110, gridspec_kw={"height_ratios": [5, 1]}
        )
        _badput_bar(bar, badput)
    else:
        fig, ax = plt.subplots(figsize=(10, 4.5), dpi=110)
    steps = [float("nan") if s is None else s for _, s in samples]
    ax.plot([t - t0 for t, _ in samples], steps, color="tab:blue", linewidth=1.6, label="step")
    detected = None
    for event in sorted(events, key=lambda e: e["time"]):
        if event.get("event") == "detected":
            detected = event["time"]
        elif event.get("event") == "resumed" and detected is not None:
            ax.axvspan(
                detected - t0,
                event["time"] - t0,
                color="0.85",
                zorder=0,
                label="recovering" if not ax.patches else None,
            )
            detected = None
    seen: set[str] = set()
    for event in events:
        mark = MARKS.get(event.get("event", ""))
        if mark is None:
            continue
        colour, style, label = mark
        ax.axvline(
            event["time"] - t0,
            color=colour,
            linestyle=style,
            linewidth=1.1,
            label=None if label in seen else label,
        )
        seen.add(label)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("training step")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def _badput_bar(ax, badput: dict[str, float]) -> None:
    total = sum(badput.values()) or 1.0
    left = 0.0
    for name, seconds in badput.items():
        share = seconds / total
        ax.barh(
            0, share, left=left, color=BADPUT_COLOURS.get(name, "0.5"), label=f"{name} {share:.1%}"
        )
        left += share
    ax.set_xlim(0, 1)
    ax.set_yticks([])
    ax.set_xlabel("share of the faulted run's wall time")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.9), ncol=4, fontsize=7, frameon=False)
