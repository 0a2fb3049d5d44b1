"""Helpers for trainer tests: real `python -m trainer` processes, free ports, summaries.

Every process is started in its own session (process group) and killed by its pgid in a finally;
nothing here kills by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trainer_env(devices: int = 1, extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        PYTHONWARNINGS="ignore",
        PYTHONUNBUFFERED="1",
    )
    env.pop("TPUPOD_STATUS_FILE", None)
    env.update(extra or {})
    return env


class Trainer:
    """One `python -m trainer` subprocess with its stdout/stderr in files."""

    def __init__(self, args: list[str], log_dir: Path, name: str, env: dict):
        log_dir.mkdir(parents=True, exist_ok=True)
        self.out_path, self.err_path = log_dir / f"{name}.out", log_dir / f"{name}.err"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainer", *args],
            cwd=REPO,
            env=env,
            stdout=self.out_path.open("w"),
            stderr=self.err_path.open("w"),
            start_new_session=True,
        )

    @property
    def stdout(self) -> str:
        return self.out_path.read_text()

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    def lines(self) -> list[dict]:
        out = []
        for line in self.stdout.splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def last_step(self) -> int:
        steps = [r["step"] for r in self.lines() if "step" in r and "event" not in r]
        return max(steps, default=0)

    def wait_for(self, predicate, timeout: float = 180.0, what: str = "condition") -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if predicate():
                return
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"trainer exited {self.proc.returncode} before {what}:\n{self.stderr[-3000:]}"
                )
            time.sleep(0.02)
        raise AssertionError(f"timed out waiting for {what}")

    def wait(self, timeout: float = 240.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"trainer timed out:\n{self.stderr[-3000:]}") from None

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def run_ok(spawn, args, log_dir, name, devices=1, env=None, code=0) -> Trainer:
    t = spawn(args, log_dir, name, devices, env)
    rc = t.wait()
    assert rc == code, f"{name}: exit {rc}, expected {code}\n{t.stderr[-4000:]}"
    return t


def multi_args(port: int, n: int, i: int) -> list[str]:
    return [
        "--coordinator",
        f"127.0.0.1:{port}",
        "--num-processes",
        n,
        "--process-id",
        i,
        "--init-timeout",
        60,
    ]


def summary(workdir) -> dict:
    if str(workdir).startswith("gs://"):
        import gcsfs

        return json.loads(gcsfs.GCSFileSystem().cat(f"{workdir}/summary.json"))
    return json.loads((Path(workdir) / "summary.json").read_text())


def gcs_env(port: int) -> dict:
    url = f"http://127.0.0.1:{port}"
    return {
        "STORAGE_EMULATOR_HOST": url,
        "TENSORSTORE_GCS_HTTP_URL": url,
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "abc",
        "FSSPEC_GCS_TOKEN": "anon",
        "NO_GCE_CHECK": "true",
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
    }
