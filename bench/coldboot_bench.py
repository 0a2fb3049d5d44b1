"""Cold workers' bootstrap on the local pod: the environment from the package index against from
the stack's bucket (issue 37).

Every local worker is cold: a new, empty disk at each create, as a new TPU VM boots with (its own
uv cache; only the image's Python is shared). Rounds interleave two recreates of the 2-worker
slice, `rounds` of each:
  index    envs/ deleted from the bucket first: uv's wheel and the bundle's environment come from
           PyPI, and worker 0 then publishes them (archive, upload) inside its bootstrap
  bucket   what worker 0 published: downloaded, sha256-checked, unpacked, installed offline
Per recreate, each worker's bootstrap seconds (bootstrap.json: its start to its last phase's end)
and its uv + sync phases. Rows: medians of the slowest worker per recreate; on the index path
also worker 1 alone (worker 0's includes publishing). Not a test: PyPI's speed from this sandbox
is no TPU VM's.

    uv run python -m bench coldboot
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from bench.report import Figure, median, spread
from localpod.env_seed import PREFIX, SEED_VAR
from localpod.gcp import storage
from localpod.pod import LocalPod

ARGS = "--config tiny --steps 1000000"
LEGS = ("index", "bucket")


def run(out_dir: Path, rounds: int = 3, console=None) -> dict:
    os.environ.pop(SEED_VAR, None)  # nothing carried in: the first boot builds, as on GCP
    pod = LocalPod(out_dir / "pod-coldboot", workers=2, trainer_args=ARGS)
    result: dict = {leg: [] for leg in LEGS}
    try:
        began = time.time()
        pod.up()
        _booted(pod, began)
        for r in range(rounds):
            for leg in LEGS:
                if leg == "index":
                    _forget(pod)
                began = time.time()
                pod.recreate(wait=True)
                boots = _booted(pod, began)
                result[leg].append([_summary(b) for b in boots])
                if console is not None:
                    console.print(f"coldboot round {r + 1} {leg}: "
                                  f"{max(b['total'] for b in result[leg][-1]):.1f} s")  # fmt: skip
        result["archives"] = storage.list_objects(_url(pod), pod.bucket, PREFIX)
    finally:
        pod.down()
    return result


def _url(pod: LocalPod) -> str:
    return pod.endpoints()["storage"]


def _forget(pod: LocalPod) -> None:
    for obj in storage.list_objects(_url(pod), pod.bucket, PREFIX):
        storage.delete(_url(pod), pod.bucket, obj["name"])


def _booted(pod: LocalPod, since: float, timeout: float = 900.0) -> list[dict]:
    """Every worker's bootstrap.json once each says ok, for a boot begun after `since`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        docs = []
        for i in range(pod.workers):
            try:
                docs.append(json.loads((pod.paths.tpupod_root(i) / "bootstrap.json").read_text()))
            except (OSError, ValueError):
                break
        fresh = [d for d in docs if d.get("started", 0) > since]
        if any(d["state"] == "failed" for d in fresh):
            raise RuntimeError(f"a worker's bootstrap failed: {fresh}")
        if len(fresh) == pod.workers and all(d["state"] == "ok" for d in fresh):
            return fresh
        time.sleep(0.5)
    raise RuntimeError(f"bootstrap not complete after {timeout:.0f} s")


def _summary(doc: dict) -> dict:
    phases = {p["name"]: p["seconds"] for p in doc["phases"]}
    return {"total": round(doc["phases"][-1]["ended"] - doc["started"], 3), **phases}


def figures(result: dict) -> list[Figure]:
    slowest = {leg: [max(w["total"] for w in boot) for boot in result[leg]] for leg in LEGS}
    env = {leg: [max(w.get("uv", 0) + w.get("sync", 0) for w in boot) for boot in result[leg]]
           for leg in LEGS}  # fmt: skip
    alone = [boot[1].get("uv", 0) + boot[1].get("sync", 0) for boot in result["index"]]
    figs = []
    for leg, where in (("index", "the package index"), ("bucket", "the bucket")):
        figs.append(Figure(f"coldboot: bootstrap from {where} (slowest of 2 workers)",
                           median(slowest[leg]), "s", n=len(slowest[leg]),
                           spread=spread(slowest[leg], "s"),
                           note="median; a recreated slice's whole bootstrap (metadata to the "
                           "job's start)" + ("; worker 0 also publishes" if leg == "index"
                                             else "")))  # fmt: skip
        figs.append(Figure(f"coldboot: uv + sync phases from {where} (slowest worker)",
                           median(env[leg]), "s", n=len(env[leg]), spread=spread(env[leg], "s"),
                           note="median"))  # fmt: skip
    figs.append(Figure("coldboot: uv + sync phases from the package index, worker 1 (publishes "
                       "nothing)", median(alone), "s", n=len(alone), spread=spread(alone, "s"),
                       note="median"))  # fmt: skip
    both = slowest["index"] and slowest["bucket"]
    ratio = median(slowest["bucket"]) / median(slowest["index"]) if both else None
    figs.append(Figure(
        "coldboot: bootstrap from the bucket / from the package index",
        round(ratio, 3) if ratio is not None else "not measured", "x" if ratio else "",
        "<= 1.0 x", None if ratio is None else ratio <= 1.0,
        n=min(len(slowest["index"]), len(slowest["bucket"])),
        note="ratio of the two medians above; interleaved recreates"))  # fmt: skip
    sizes = [o["size"] for o in result.get("archives", []) if not o["name"].endswith(".json")]
    figs.append(Figure("coldboot: environment archives in the bucket (uv's wheel, the "
                       "trainer's environment)", round(sum(sizes) / 1e6, 1), "MB",
                       n=len(sizes), note="zstd; the uv cache each was installed from"))  # fmt: skip
    return figs
