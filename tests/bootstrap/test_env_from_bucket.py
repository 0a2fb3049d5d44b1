"""Environments come from the bucket (issue 37.2): a worker with an empty disk installs the bundle's
environment from the archive worker 0 published, checked against its manifest's sha256; a damaged
archive is refused in one line and built again from the package index, and the archive built
then serves the next boot. The `tpu` group, from the index and then the bucket, is `slow`.

One worker of the bare slice, with a stdlib stand-in for the trainer (what it runs is not the
point here; its environment is).
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from infra.bundle_archive import build_bundle
from localpod import storage
from tests.bootstrap.test_rerun_rules import STANDIN


def boot_on_a_new_disk(single) -> list[str]:
    """Stop the job, drop the worker's whole $TPUPOD_ROOT (its uv cache too), boot: the sync
    phase's lines."""
    if (single.root(0) / "current").exists():
        single.jobctl(0, "stop", check=False)
    shutil.rmtree(single.root(0), ignore_errors=True)
    (result,) = single.boot()
    assert result.returncode == 0, result.output[-3000:]
    log = (single.root(0) / "bootstrap.log").read_text().splitlines()
    return [line.split("] ", 1)[1] for line in log if "[sync]" in line]


def manifest(single, key: str) -> dict:
    name = f"envs/{single.stack}/{key}.json"
    return json.loads(storage.download(single.storage_url, single.bucket, name))


def test_a_damaged_archive_is_refused_in_one_line_and_built_again(single, stage, tmp_path):
    root = stage(tmp_path / "bundle")
    (root / "trainer" / "__main__.py").write_text(STANDIN)
    single.publish(build_bundle(root))
    first = boot_on_a_new_disk(single)  # from the session's seed, or built and published
    (key,) = {m.group(1) for line in first if (m := re.search(r"environment ([0-9a-f]{24})", line))}
    good = manifest(single, key)

    archive = bytearray(storage.download(single.storage_url, single.bucket, good["object"]))
    archive[len(archive) // 2 : len(archive) // 2 + 64] = bytes(64)  # 64 bytes zeroed mid-file
    storage.upload(single.storage_url, single.bucket, good["object"], bytes(archive),
                   "application/octet-stream")  # fmt: skip
    second = boot_on_a_new_disk(single)
    refused = [line for line in second if "refused" in line]
    assert len(refused) == 1 and good["object"] in refused[0], second
    assert f"its manifest says {good['sha256'][:16]}" in refused[0], refused
    assert any("published to" in line for line in second), second  # built from the index
    assert not any("restored from" in line for line in second), second
    rebuilt = manifest(single, key)
    assert rebuilt["sha256"] != good["sha256"] and rebuilt["object"] != good["object"]

    third = boot_on_a_new_disk(single)
    assert any(f"restored from gs://{single.bucket}/{rebuilt['object']}" in line
               and "sha256 verified" in line for line in third), third  # fmt: skip
    assert not any("refused" in line or "published" in line for line in third), third


@pytest.mark.slow
def test_the_tpu_group_installs_from_the_index_then_from_the_bucket(single, stage, tmp_path):
    """The `tpu` group (jax[tpu], so libtpu) resolved from the lock and installed for linux
    x86_64 from the package index, as a TPU VM's first boot does; worker 0 publishes it, and a
    new disk installs it from the bucket. (The stand-in trainer: this machine has no TPU.)"""
    root = stage(tmp_path / "bundle")
    (root / "trainer" / "__main__.py").write_text(STANDIN)
    single.publish(build_bundle(root), tpupod_uv_group="tpu")
    single.forget_environments()
    first = boot_on_a_new_disk(single)
    assert any("--group tpu" in line for line in first), first
    assert any("no environment" in line for line in first), first
    assert any("published to" in line for line in first), first
    (site,) = (single.root(0) / "current" / ".venv" / "lib").glob("python3.*/site-packages")
    assert list(site.glob("libtpu*")), sorted(p.name for p in site.iterdir())
    second = boot_on_a_new_disk(single)
    assert any("restored from" in line for line in second), second
    (site,) = (single.root(0) / "current" / ".venv" / "lib").glob("python3.*/site-packages")
    assert list(site.glob("libtpu*"))
