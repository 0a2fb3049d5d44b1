"""The bootstrap runs nothing it has not pinned (issue 17.4).

uv comes only from its hash-pinned wheel (the bucket's copy or the index's): with neither, an
unreachable index, a wheel with other bytes or a python3 without pip fail the uv phase with one line
naming what is missing, and nothing is installed. No script is ever piped to a shell, and the metadata access token is on no command
line. Shims on the workers' PATH record what really ran: every curl's argv, and every shell that
read its script from a pipe; each then runs the real program.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from infra.bundle_archive import PROJECT_ROOT
from localpod.vm.environment import SYSTEM_PATH, uv_executable

UV_VERSION = "0.13.9"
SHELLS = ("sh", "bash", "dash")

CURL_SHIM = """#!/bin/bash
printf '%s\\0' "$@" >"{log}/curl.$$.$RANDOM.argv"
exec {real} "$@"
"""

# A shell with no script operand and no -c reads its script from stdin: from a pipe, that is
# curl-to-shell (or its like).
SHELL_SHIM = """#!/bin/bash
from_stdin=1 skip=0
for arg in "$@"; do
  if [ "$skip" = 1 ]; then skip=0; continue; fi
  case "$arg" in
  -c | -[a-z]*c*) from_stdin=0; break ;;
  -o | +o) skip=1 ;;
  -s | -) break ;;
  -*) ;;
  *) from_stdin=0; break ;;
  esac
done
if [ "$from_stdin" = 1 ] && [ -p /dev/stdin ]; then
  printf '%s\\n' "{name} $*" >>"{log}/shell-from-pipe"
fi
exec {real} "$@"
"""


class Shims:
    def __init__(self, root: Path):
        self.bin, self.log = root / "bin", root / "log"
        self.bin.mkdir(parents=True)
        self.log.mkdir()
        for name in ("curl", *SHELLS):
            real = shutil.which(name, path=SYSTEM_PATH)
            if real is None:
                continue
            text = CURL_SHIM if name == "curl" else SHELL_SHIM
            shim = self.bin / name
            shim.write_text(text.format(log=self.log, real=real, name=name))
            shim.chmod(0o755)

    def curl_calls(self) -> list[list[str]]:
        return [p.read_text().split("\0")[:-1] for p in sorted(self.log.glob("curl.*.argv"))]

    def piped_shells(self) -> list[str]:
        piped = self.log / "shell-from-pipe"
        return piped.read_text().splitlines() if piped.exists() else []


@pytest.fixture
def shims(tmp_path):
    return Shims(tmp_path / "shims")


def assert_uv_phase_failed(single, result, message_start: str) -> str:
    assert result.returncode != 0, result.output
    boot = single.bootstrap(0)
    assert (boot["state"], boot["phase"]) == ("failed", "uv"), boot
    message = boot["message"]
    assert message.startswith(message_start), message
    assert "\n" not in message
    log = (single.root(0) / "bootstrap.log").read_text()
    assert log.count("FAILED:") == 1 and f"[uv] FAILED: {message}" in log
    assert "[sync]" not in log
    tools = single.root(0) / "tools"
    assert not tools.exists() or list(tools.iterdir()) == []  # nothing half-installed
    assert not (single.root(0) / "bin" / "uv").exists()
    return message


def assert_only_metadata_and_bucket_fetched(single, shims: Shims) -> None:
    metadata = f"http://{single.addresses[0]}:{single.metadata_port}/computeMetadata/v1/"
    bucket = f"{single.storage_url}/storage/v1/b/{single.bucket}/"
    calls = shims.curl_calls()
    assert calls, "the curl shim saw no call"
    for argv in calls:
        urls = [a for a in argv if "://" in a]
        assert urls and all(u.startswith((metadata, bucket)) for u in urls), argv
    assert shims.piped_shells() == []


def test_unreachable_index_fails_the_uv_phase_in_one_line(single, bundles, shims):
    single.publish(bundles[0])
    single.forget_environments()  # no uv wheel in the bucket either
    index = "http://127.0.0.1:1/simple/"
    (result,) = single.boot(
        PATH=f"{shims.bin}:{SYSTEM_PATH}",  # no uv anywhere
        PIP_CONFIG_FILE="/dev/null",  # this machine's pip.conf: no find-links, no mirrors
        PIP_INDEX_URL=index,
        PIP_RETRIES="0",
    )
    message = assert_uv_phase_failed(
        single, result, f"cannot install uv {UV_VERSION} from its hash-pinned wheel"
    )
    assert f"make {index} reachable" in message and f"uv >= {UV_VERSION} on PATH" in message
    assert_only_metadata_and_bucket_fetched(single, shims)


def other_wheel(wheels: Path) -> Path:
    """A uv 0.13.9 wheel (any platform) that PyPI never served."""
    wheels.mkdir()
    with zipfile.ZipFile(wheels / f"uv-{UV_VERSION}-py3-none-any.whl", "w") as wheel:
        wheel.writestr(f"uv-{UV_VERSION}.data/scripts/uv", "#!/bin/sh\necho tampered\n")
        info = f"uv-{UV_VERSION}.dist-info"
        wheel.writestr(
            f"{info}/METADATA", f"Metadata-Version: 2.1\nName: uv\nVersion: {UV_VERSION}\n"
        )
        wheel.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: py3-none-any\n"
        )
        wheel.writestr(f"{info}/RECORD", "")
    return wheels


def test_wheel_with_other_bytes_is_refused(single, bundles, shims, tmp_path):
    """A mirror serving its own uv 0.13.9: pip refuses it on its sha256."""
    wheels = other_wheel(tmp_path / "wheels")
    single.publish(bundles[0])
    single.forget_environments()
    (result,) = single.boot(
        PATH=f"{shims.bin}:{SYSTEM_PATH}",
        PIP_CONFIG_FILE="/dev/null",
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(wheels),
    )
    assert_uv_phase_failed(single, result, f"refusing uv {UV_VERSION}: the wheel pip was served")
    assert "DO NOT MATCH THE HASHES" in (single.root(0) / "bootstrap.log").read_text()
    assert_only_metadata_and_bucket_fetched(single, shims)


def test_a_wheel_with_other_bytes_in_the_bucket_is_refused(single, bundles, shims, tmp_path):
    """Published to the bucket with a manifest that agrees with it (as a worker of the stack
    could), but not a wheel PyPI served: refused on the sha256 pinned in startup.sh."""
    wheels = other_wheel(tmp_path / "wheels")
    (wheels / ".tpupod-complete").touch()
    single.publish(bundles[0])
    single.forget_environments()
    env = {**single.env(0), "MD_BUCKET": single.bucket, "MD_STACK": single.stack}
    key = f"uv-{UV_VERSION}-{platform.machine()}"
    subprocess.run([sys.executable, "-I", "-S", str(PROJECT_ROOT / "bootstrap" / "envcache.py"),
                    "publish", key, str(wheels)], env=env, check=True)  # fmt: skip
    (result,) = single.boot(PATH=f"{shims.bin}:{SYSTEM_PATH}", PIP_CONFIG_FILE="/dev/null",
                            PIP_NO_INDEX="1")  # fmt: skip
    assert_uv_phase_failed(
        single, result, f"refusing uv {UV_VERSION}: the wheel from gs://{single.bucket}"
    )
    assert "restored from" in (single.root(0) / "bootstrap.log").read_text()


def test_python_without_pip_is_named(single, bundles, shims, tmp_path):
    nopip = tmp_path / "nopip"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(nopip)], check=True)
    single.publish(bundles[0])
    single.forget_environments()
    (result,) = single.boot(PATH=f"{shims.bin}:{nopip / 'bin'}:{SYSTEM_PATH}")
    message = assert_uv_phase_failed(single, result, "cannot install uv: python3 has no pip")
    assert "apt-get install -y python3-pip" in message
    assert_only_metadata_and_bucket_fetched(single, shims)


def test_token_on_no_command_line_and_nothing_piped_to_a_shell(single, bundles, shims):
    """A whole boot with the shims: it completes, and every curl argv is clean."""
    single.publish(bundles[0])
    uv = uv_executable()
    assert uv is not None, "uv is not on the operator's PATH"
    (result,) = single.boot(PATH=f"{shims.bin}:{uv.parent}:{SYSTEM_PATH}")
    assert result.returncode == 0, result.output[-3000:]
    assert single.bootstrap(0)["state"] == "ok"
    calls = shims.curl_calls()
    downloads = [argv for argv in calls if any("alt=media" in a for a in argv)]
    assert len(downloads) == 1
    download = downloads[0]
    assert download[download.index("-H") + 1] == "@-"  # the header came on stdin
    for argv in calls:
        for arg in argv:
            assert "Bearer" not in arg and "Authorization" not in arg, argv
            assert arg not in ("local", "--oauth2-bearer"), argv  # the local pod's token
    assert shims.piped_shells() == []
    state = single.root(0) / ".bootstrap"
    assert state.stat().st_mode & 0o777 == 0o700
    assert list(state.glob("md.*")) == []  # no metadata body (token) left behind


# --- the scripts as written ---------------------------------------------------------------------

# A download piped into a shell, fed to one as `-c "$(...)"`, or as a process substitution.
PIPE_TO_SHELL = re.compile(
    r"\|\s*(?:sudo\s+(?:-\S+\s+)*)?(?:env\b[^|;&\n]*?\s)?(?:\S*/)?(?:ba|da|z|k)?sh\b"
    r"|\b(?:ba|da|z|k)?sh\s+(?:-\w+\s+)*[\"']?\$\(\s*(?:curl|wget)"
    r"|\b(?:ba|da|z|k)?sh\s+<\(\s*(?:curl|wget)"
)
# What startup.sh did before issue 17: the regex must catch it.
OLD_FALLBACK = """      curl --silent --show-error --fail --location --retry 5 \\
        "https://astral.sh/uv/$TPUPOD_UV_VERSION/install.sh" |
        env UV_INSTALL_DIR="$dir" UV_NO_MODIFY_PATH=1 sh
"""


def joined_lines(text: str) -> str:
    """Continuation lines joined: a pipeline may go on after a trailing `|` or `\\`."""
    return re.sub(r"(\||\\)[ \t]*\n\s*", r"\1 ", text)


def shell_sources() -> dict[str, str]:
    sources = {str(p): p.read_text() for p in (PROJECT_ROOT / "bootstrap").glob("*.sh")}
    sources[".ci/run"] = (PROJECT_ROOT / ".ci" / "run").read_text()
    for workflow in (PROJECT_ROOT / ".github" / "workflows").glob("*.yml"):
        for name, job in yaml.safe_load(workflow.read_text())["jobs"].items():
            for i, step in enumerate(job.get("steps", [])):
                if "run" in step:
                    sources[f"{workflow.name}:{name}:{i}"] = step["run"]
    return sources


def test_the_pattern_catches_curl_to_shell():
    for text in (
        OLD_FALLBACK,
        "curl -LsSf https://astral.sh/uv/install.sh | sh",
        "wget -qO- https://x/install.sh | sudo -E bash -s --",
        "curl -fsSL https://x | /bin/bash",
        'sh -c "$(curl -fsSL https://x)"',
        "bash <(curl -s https://x)",
    ):
        assert PIPE_TO_SHELL.search(joined_lines(text)), text
    for text in ("sha256sum f | cut -d' ' -f1", "ps -eo pid= | awk '{print $1}'", "a | tee -a log"):
        assert not PIPE_TO_SHELL.search(joined_lines(text)), text


def test_no_script_pipes_anything_into_a_shell():
    sources = shell_sources()
    assert len(sources) >= 4
    for name, text in sources.items():
        found = PIPE_TO_SHELL.search(joined_lines(text))
        assert found is None, f"{name}: {found.group(0)!r}"
        assert "astral.sh" not in text and "install.sh" not in text, name
