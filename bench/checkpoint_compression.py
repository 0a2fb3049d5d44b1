"""Config `checkpoint_compression` measured both ways on the pod's GCS emulator: the bytes of a
committed step of `small` and its save-on-notice seconds, raw and zstd (the default is raw)."""

from __future__ import annotations

import json
import os
import signal

from bench.storage_trainer import BUCKET, events_in, start_trainer, until_step


def compression_case(config: str, env: dict, cc: str) -> dict:
    """Config `checkpoint_compression` both ways: one run each, SIGTERM after step 2; the bytes of
    the step it commits and its save-on-notice seconds (the default is raw: this is why)."""
    out = {"config": config}
    for name, on in (("raw", False), ("zstd", True)):
        wd = f"gs://{BUCKET}/runs/{config}-{name}"
        sets = [f"checkpoint_compression={str(on).lower()}"]
        proc = start_trainer(config, 10, wd, sets, env, cc)
        try:
            until_step(proc, 2)
            proc.send_signal(signal.SIGTERM)
            term = events_in(proc.stdout.read())["preempted"]
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        prefix = f"{wd.removeprefix(f'gs://{BUCKET}/')}/checkpoints/{term['step']}/"
        out[name] = {"bytes": prefix_bytes(env, prefix), "save_on_notice_s": term["save_s"]}
    return out


def prefix_bytes(env: dict, prefix: str) -> int:
    """Total size of the bucket's objects under `prefix` (the JSON API's list, every page)."""
    from urllib.parse import quote
    from urllib.request import urlopen

    total, token = 0, ""
    while True:
        url = (f"{env['STORAGE_EMULATOR_HOST']}/storage/v1/b/{BUCKET}/o?prefix={quote(prefix)}"
               f"&maxResults=1000" + (f"&pageToken={quote(token)}" if token else ""))  # fmt: skip
        with urlopen(url, timeout=30) as r:
            page = json.load(r)
        total += sum(int(o["size"]) for o in page.get("items", []))
        if not (token := page.get("nextPageToken")):
            return total


def compression_figure(c: dict):
    from bench.report import Figure

    raw, zstd = c["raw"], c["zstd"]
    return Figure(f"checkpoint bytes, {c['config']}: zstd / raw", zstd["bytes"] / raw["bytes"], "x",
                  note=f"one step of {c['config']} on the pod's GCS emulator (OCDBT, 1 process): "
                  f"raw {raw['bytes'] / 1e6:.0f} MB, zstd {zstd['bytes'] / 1e6:.0f} MB; save on "
                  f"notice raw {raw['save_on_notice_s']} s, zstd {zstd['save_on_notice_s']} s; "
                  "the default is raw (config checkpoint_compression)")  # fmt: skip
