"""Checkpoints on the pod's storage (the GCS emulator on loopback, OCDBT, as the pod runs).

`storage_run`: restore seconds (`tiny`, `small`), save-on-notice seconds, steps lost on a SIGKILL
at the interval used, and where a restore's time goes (objects per step, requests and their
latency). Every case runs `runs` times, in rounds (each round every case once, each in a run
directory of its own): a row is the median of its rounds, its spread every round's value, and a
steps-lost row is met only if every round's kill is. `smoke`: Orbax save + restore of a
tiny-sized tree through the emulator, in seconds (CI).

    uv run python -m bench storage                      # the rows, into BENCHMARKS.md
    uv run python -m bench.checkpoint_storage [--smoke] [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

from bench.checkpoint_compression import compression_case, compression_figure
from bench.storage_trainer import (
    BUCKET,
    emulator,
    events_in,
    median_step_time,
    start_trainer,
    until_step,
)

# tiny <= 1 s is issue 15's; small's restore goal is ours (a 52M-parameter model with its Adam
# state, ~0.6 GB); a save on notice must commit well inside the 30 s notice: half of it.
GOALS = {"restore_tiny_s": 1.0, "restore_small_s": 10.0, "save_tiny_s": 15.0, "save_small_s": 15.0}


def _requests(log: Path, since: int) -> int:
    """Object requests the emulator logged after byte offset `since` of its log."""
    with log.open("rb") as f:
        f.seek(since)
        return sum(1 for x in f if b"/o" in x and b'HTTP/1.1"' in x)


def storage_case(
    config: str, steps: int, every: int, env: dict, log: Path, cc: str, run: int = 0
) -> dict:
    """One preset on the emulator: SIGTERM at step `every`+1 (save on notice), resume (restore
    seconds, requests), then SIGKILL at a step past a save and resume (steps lost). Whether saves
    keep up with the interval: the notice save's seconds against the killed run's median step
    time times the interval."""
    wd = f"gs://{BUCKET}/runs/{config}-every{every}-round{run}"
    sets = [f"checkpoint_every={every}"]
    proc = start_trainer(config, steps, wd, sets, env, cc)
    try:
        until_step(proc, every + 1)
        proc.send_signal(signal.SIGTERM)
        term = events_in(proc.stdout.read())["preempted"]
        proc.wait(timeout=300)
        before = log.stat().st_size
        proc = start_trainer(config, steps, wd, sets, env, cc)
        first = until_step(proc, term["step"] + 1)
        restored, requests = events_in(first).get("restored", {}), _requests(log, before)
        kill_at = term["step"] + every + max(every // 2, 1)  # mid-interval, one save after resume
        step_s = median_step_time(first + until_step(proc, kill_at))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc = start_trainer(config, steps, wd, sets, env, cc)
        resumed = events_in(until_step(proc, kill_at + 1)).get("restored", {})
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    return {
        "config": config,
        "checkpoint_every": every,
        "round": run,
        "save_on_notice_s": term.get("save_s"),
        "restore_s": restored.get("seconds"),
        "restore_requests": requests,
        "killed_at": kill_at,
        "resumed_from": resumed.get("step"),
        "steps_lost": kill_at - resumed["step"] if "step" in resumed else None,
        "step_s": step_s,  # median seconds a step in the killed run
        "interval_s": step_s * every if step_s else None,
    }


def storage_figures(r: dict) -> list:
    """BENCHMARKS.md rows, each with its goal and a judged met / not met: per preset, the median
    restore and save-on-notice seconds of its first interval's rounds; per case, steps lost."""
    from bench.report import Figure, median, spread

    groups: dict[tuple[str, int], list[dict]] = {}
    for c in r["cases"]:
        groups.setdefault((c["config"], c["checkpoint_every"]), []).append(c)
    rows, timed = [], set()
    for (cfg, every), cases in groups.items():
        where = f"{cfg} on the pod's GCS emulator (OCDBT), checkpoint_every={every}"
        if cfg not in timed:  # restore and save seconds: the first case of each preset
            timed.add(cfg)
            rounds = f"; median of {len(cases)} rounds" if len(cases) > 1 else ""
            restore = [c["restore_s"] for c in cases]
            requests = median([c["restore_requests"] for c in cases])
            goal = r["goals"].get(f"restore_{cfg}_s")
            rows.append(Figure(f"checkpoint restore seconds, {cfg}", median(restore), "s",
                               f"<= {goal:g} s" if goal else "", _met(median(restore), goal),
                               note=f"{where}: listing, checks and every read; "
                               f"{requests:g} object requests{rounds}", n=_n(restore),
                               spread=spread(restore, "s", 3)))  # fmt: skip
            save = [c["save_on_notice_s"] for c in cases]
            goal = r["goals"].get(f"save_{cfg}_s")
            rows.append(Figure(f"checkpoint save on notice seconds, {cfg}", median(save), "s",
                               f"<= {goal:g} s (half the 30 s notice)" if goal else "",
                               _met(median(save), goal), note=f"{where}: SIGTERM to committed "
                               f"(the trainer's preempted.save_s){rounds}", n=_n(save),
                               spread=spread(save, "s", 3)))  # fmt: skip
        rows.append(steps_lost_rounds(cases, where))
    if "compression" in r:  # runs before the compression choice have none
        rows.append(compression_figure(r["compression"]))
    lat = r["latency"]
    rows.append(Figure("GCS emulator: one small GET", lat["median_s"] * 1e3, "ms",
                       note=f"median of 200 on a kept-alive connection, p90 "
                       f"{lat['p90_s'] * 1e3:.2f} ms"))  # fmt: skip
    return rows


def _n(values: list) -> int:
    return sum(v is not None for v in values)


def steps_lost_rounds(cases: list[dict], where: str):
    """One case's rounds as one row: every round's steps lost, met only if every round's is."""
    if len(cases) == 1:
        return steps_lost_figure(cases[0], where)
    each = [steps_lost_figure(c, where) for c in cases]
    first = each[0]
    verdicts = [f.met for f in each]
    met = None if None in verdicts else all(verdicts)
    notes = "; ".join(f"round {i + 1}: {f.note.removeprefix(where + ': ')}"
                      for i, f in enumerate(each))  # fmt: skip
    first.value = ", ".join(str(f.value) for f in each)
    first.met, first.n = met, len(each)
    first.note = f"{where}: each round; met only if every round is; {notes}"
    return first


def steps_lost_figure(c: dict, where: str):
    """Judged (bench.steps_lost) only where a save is faster than an interval of steps: issue
    15's goal holds "once saves are faster than the interval". Where it is not (a save of tiny
    outlasts 5 of its steps), saves queue up behind each other and a kill can lose more; the row
    shows it, unjudged (the trainer says so and names the fix once a save comes due while
    another writes)."""
    from bench.report import Figure
    from bench.steps_lost import Loss, goal_text

    every, save_s, interval_s = c["checkpoint_every"], c["save_on_notice_s"], c["interval_s"]
    note = (f"{where}: SIGKILL at step {c['killed_at']} (mid-interval), resumed from "
            f"{c['resumed_from']}; a save {save_s} s, an interval "
            f"{interval_s:.2f} s ({every} steps of {c['step_s'] * 1e3:.0f} ms)")  # fmt: skip
    name = f"steps lost on a kill, {c['config']} (every {every})"
    if save_s is not None and save_s < interval_s and c["resumed_from"] is not None:
        met = Loss(c["killed_at"], c["resumed_from"]).within(every)
        return Figure(name, c["steps_lost"], "steps", goal_text(every), met, note=note)
    return Figure(name, c["steps_lost"], "steps", note=f"{note}: saves slower than the "
                  "interval, so no goal applies (raise checkpoint_every)")  # fmt: skip


def smoke_figures(r: dict) -> list:
    from bench.report import Figure

    note = f"SYNTHETIC: 12 arrays of 64x192 float32 in-process, {r['objects']} objects"
    return [
        Figure("smoke: checkpoint save seconds (OCDBT, emulator)", r["save_s"], "s", note=note),
        Figure(
            "smoke: checkpoint restore seconds (OCDBT, emulator)",
            r["restore_s"],
            "s",
            f"<= {r['goals']['restore_tiny_s']:g} s",
            _met(r["restore_s"], r["goals"]["restore_tiny_s"]),
            note=note,
        ),  # fmt: skip
    ]


def _met(value, goal) -> bool | None:
    return None if value is None or goal is None else value <= goal


def request_latency(env: dict, n: int = 200) -> dict:
    """Median and p90 seconds of one small object GET on a kept-alive connection."""
    import http.client

    url = env["STORAGE_EMULATOR_HOST"].removeprefix("http://")
    conn = http.client.HTTPConnection(url, timeout=10)
    body = b"x" * 1024
    conn.request("POST", f"/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name=lat", body)
    conn.getresponse().read()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        conn.request("GET", f"/storage/v1/b/{BUCKET}/o/lat?alt=media")
        conn.getresponse().read()
        times.append(time.perf_counter() - t0)
    conn.close()
    times.sort()
    return {"median_s": statistics.median(times), "p90_s": times[int(0.9 * len(times))]}


def storage_run(
    configs=(("tiny", 300, 100), ("tiny", 40, 5), ("small", 30, 4)), runs: int = 3, console=None
) -> dict:
    """tiny at 100 steps per save, the goodput job's interval (its saves keep up: about 0.3 s a
    save against 100 steps of under 10 ms; at 40 they no longer did), and at 5 (they do not);
    small at 4 steps per save: about 7 s per step on a 2-core CPU, so three starts of it
    (SIGTERM, resume, SIGKILL, resume) stay within minutes. `runs` rounds, each every case once."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "emulator.log"
        with emulator(log) as env:
            cc = str(Path(tmp) / "cc")
            cases = []
            for run in range(runs):
                for c, s, e in configs:
                    if console is not None:
                        console.print(f"storage round {run + 1} of {runs}: {c}, every {e}")
                    cases.append(storage_case(c, s, e, env, log, cc, run))
            compression = compression_case("small", env, cc)
            latency = request_latency(env)
    return {"cases": cases, "compression": compression, "latency": latency, "goals": GOALS,
            "runs": runs}  # fmt: skip


def smoke() -> dict:
    """Orbax OCDBT save + restore of a `tiny`-sized tree through the emulator, in-process."""
    import numpy as np

    with tempfile.TemporaryDirectory() as tmp, emulator(Path(tmp) / "emu.log") as env:
        os.environ.update(env)
        import orbax.checkpoint as ocp

        rng = np.random.default_rng(0)
        tree = {f"w{i}": rng.standard_normal((64, 192), np.float32) for i in range(12)}
        path = f"gs://{BUCKET}/smoke/state"
        ckptr = ocp.StandardCheckpointer()
        t0 = time.perf_counter()
        ckptr.save(path, tree)
        ckptr.wait_until_finished()
        save_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        back = ckptr.restore(path, tree)
        restore_s = time.perf_counter() - t0
        assert all(np.array_equal(tree[k], back[k]) for k in tree)
        import gcsfs

        objects = len(gcsfs.GCSFileSystem().find(path))
    return {"save_s": save_s, "restore_s": restore_s, "objects": objects, "goals": GOALS}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="the in-process smoke instead")
    p.add_argument("--runs", type=int, default=3, help="rounds of every case [3]")
    a = p.parse_args()
    print(json.dumps(smoke() if a.smoke else storage_run(runs=a.runs), indent=1))
