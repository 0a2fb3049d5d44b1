"""Environments come from the bucket (issue 37.2): a worker with an empty disk installs the bundle's
environment from the archive worker 0 published, checked against its manifest's sha256; a damaged
archive is refused in one line and built again from the package index, and the archive built
then restores. The `tpu` group, from the index and then the bucket, is `slow`.

One worker of the bare slice, with a stdlib stand-in for the trainer (what it runs is not the
point here; its environment is).
"""

from __future__ import annotations

import json
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra.bundle_archive import PROJECT_ROOT, build_bundle
from localpod.gcp import storage
from localpod.vm.environment import SYSTEM_PATH, image_bin, registry_unreachable_env, uv_executable
from tests.bootstrap.test_no_blind_trust import UV_VERSION
from tests.bootstrap.test_rerun_rules import STANDIN


def boot_on_a_new_disk(single) -> list[str]:
    """Stop the job, drop the worker's whole $TPUPOD_ROOT and its memory (where its environments
    and their uv caches live), boot: the sync phase's lines."""
    if (single.root(0) / "current").exists():
        single.jobctl(0, "stop", check=False)
    shutil.rmtree(single.root(0), ignore_errors=True)
    shutil.rmtree(single.memory(0), ignore_errors=True)
    (result,) = single.boot()
    assert result.returncode == 0, result.output[-3000:]
    log = (single.root(0) / "bootstrap.log").read_text().splitlines()
    return [line.split("] ", 1)[1] for line in log if "[sync]" in line]


def manifest(single, key: str) -> dict:
    name = f"envs/{single.stack}/{key}.json"
    return json.loads(storage.download(single.storage_url, single.bucket, name))


# `slow` (a minute: the environment built again from the index; CI stays under 20 minutes): the
# refusal itself, by sha256 and for an archive that does not unpack, is in CI in
# test_envcache_restore.py.
@pytest.mark.slow
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

    # What the next new disk gets: the rebuilt archive, restored and verified.
    env = {**single.env(0), "MD_BUCKET": single.bucket, "MD_STACK": single.stack}
    restore = subprocess.run(
        [sys.executable, "-I", "-S", str(PROJECT_ROOT / "bootstrap" / "envcache.py"), "restore",
         key, str(tmp_path / "restored")], env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert restore.returncode == 0, restore.stdout + restore.stderr
    assert f"restored from gs://{single.bucket}/{rebuilt['object']}" in restore.stdout
    assert (tmp_path / "restored" / ".tpupod-complete").exists()


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


def test_a_python_the_image_lacks_comes_from_the_bucket(single, stage, tmp_path):
    """TPU images ship Python 3.10; uv downloads a newer one from GitHub. Worker 0 publishes it,
    and later boots restore it: here 3.12, which this worker image lacks, from a managed
    install published to the bucket (this machine's 3.12 in uv's layout: GitHub is out of reach
    here). Without that archive the same boot tries the download, and with no route out fails."""
    python = Path("/root/.pyenv/versions/3.12.1/bin/python3.12")
    if not python.exists():
        pytest.skip("no Python 3.12 on this machine to publish")
    managed = tmp_path / "published" / "cpython-3.12.1-linux-x86_64-gnu" / "bin"
    managed.mkdir(parents=True)
    (managed / "python3.12").symlink_to(python)
    root = stage(tmp_path / "bundle")
    (root / "trainer" / "__main__.py").write_text(STANDIN)
    single.publish(build_bundle(root))
    uv = uv_executable()  # the operator's: uv itself is not what this test is about
    path = f"{uv.parent}:{image_bin(single.tmp)}:{SYSTEM_PATH}"
    offline = registry_unreachable_env(single.addresses)

    (failed,) = single.boot(PATH=path, TPUPOD_PYTHON="3.12", **offline)
    assert failed.returncode != 0 and single.bootstrap(0)["phase"] == "uv", failed.output[-2000:]
    assert "no environment python-3.12-" in failed.output, failed.output[-2000:]

    env = {**single.env(0), "MD_BUCKET": single.bucket, "MD_STACK": single.stack}
    key = f"python-3.12-{platform.machine()}-uv{UV_VERSION}"
    subprocess.run([sys.executable, "-I", "-S", str(PROJECT_ROOT / "bootstrap" / "envcache.py"),
                    "publish", key, str(tmp_path / "published")], env=env, check=True)  # fmt: skip
    shutil.rmtree(single.root(0))
    (booted,) = single.boot(PATH=path, TPUPOD_PYTHON="3.12")  # the sync may need the index
    assert booted.returncode == 0, booted.output[-3000:]
    log = (single.root(0) / "bootstrap.log").read_text()
    assert f"environment {key} restored from gs://" in log, log[-3000:]
    assert f"python 3.12 at {single.root(0) / 'python'}" in log, log[-3000:]
