"""Hang forensics: before `watch` restarts a hung job, keep what the restart would destroy.

On every worker, as root (the job is root's; `sudo -n` when the login is not root): the Python
stacks of each Python process in the job's process tree (the launcher in `job.pid` and its
descendants), every thread with its arguments and locals, native frames too where the job's
spec asks for them (`hang_stacks: native`; failing natives: without them), and the last lines
of job.log. A stopped process cannot be suspended: it is read with `--nonblocking` (it runs
no code meanwhile, so its locals read consistently). Natives are not the default: py-spy reads
every loaded library's symbols for them (0.6-0.7 s for a JAX process on the local pod's 2
cores, 10 ms without), and the capture holds the hang's restart; Google's own
cloud-tpu-diagnostics keeps Python stacks alone. py-spy comes from the worker's own environment
(the bundle's `.venv`, where it is a tpupod dependency) or its PATH. One file per worker lands in
`<journal dir>/incidents/<N>/worker-<i>.txt` and, when `watch` keeps its state in the bucket
(always, from the CLI), in `gs://BUCKET/ops/<stack>/incidents/<N>/`: the watcher VM's disk is out
of the operator's reach. The journal line `forensics` names them, and
`tpupod logs --stack S --incident N` prints them (the bucket's copy when there is none here).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ops.cloud.storage_errors import STORAGE_ERRORS
from ops.fleet.workers import WorkerGroup, as_root

LOG_LINES = 80
SPY_TIMEOUT_S = 20
# Runs under bash as root with $TPUPOD_ROOT set (ops.fleet.workers.as_root).
# py-spy's ways to read a process, tried in turn until one works ($modes): a running one as
# the job's spec asks (natives or not), a stopped one without suspending it.
MODES = {
    True: ("--native --locals", "--locals", "--nonblocking"),
    False: ("--locals", "--nonblocking"),
}
STOPPED_MODES = ("--nonblocking --locals", "--nonblocking")
TEMPLATE = f"""R="$TPUPOD_ROOT"
p=$(cat "$R/job.pid" 2>/dev/null || true)
spy=
for c in "$R/current/.venv/bin/py-spy" "$(command -v py-spy 2>/dev/null)"; do
  if [ -n "$c" ] && [ -x "$c" ]; then spy=$c; break; fi
done
echo "@@ job.pid: ${{p:-none}}; py-spy: ${{spy:-not found}}"
tree=
if [ -n "$p" ] && [ -d "/proc/$p" ]; then
  tree=$(ps -eo pid=,ppid= | awk -v root="$p" '
    {{ parent[$1] = $2 }}
    END {{ for (q in parent) {{ r = q; while (r != "" && r != root && r != 0 && r != 1) r = parent[r]
      if (r == root) print q }} }}' | sort -n)
fi
for q in $tree; do
  exe=$(readlink "/proc/$q/exe" 2>/dev/null || true)
  case "${{exe##*/}}" in python*) ;; *) continue ;; esac
  echo "@@ process $q: $(tr '\\0' ' ' < "/proc/$q/cmdline" 2>/dev/null)"
  if [ -z "$spy" ]; then echo "(no py-spy on this worker: no stacks)"; continue; fi
  modes=(@MODES@)
  case "$(cut -d' ' -f3 "/proc/$q/stat" 2>/dev/null)" in
    T|t) echo "(process stopped, e.g. SIGSTOP: read without suspending it)"
         modes=(@STOPPED@);;
  esac
  ok=
  for mode in "${{modes[@]}}"; do
    # shellcheck disable=SC2086 # a mode is one or more flags
    if out=$(timeout {SPY_TIMEOUT_S} "$spy" dump --pid "$q" $mode 2>&1); then
      echo "$out"; ok=1; break
    fi
  done
  [ -n "$ok" ] || printf '(py-spy could not read the stacks)\n%s\n' "$out"
done
[ -n "$tree" ] || echo "(no job process alive)"
echo "@@ last {LOG_LINES} lines of job.log"
tail -n {LOG_LINES} "$R/job.log" 2>/dev/null || echo "(no job.log)"
"""


def script(native: bool) -> str:
    """TEMPLATE with py-spy's modes for this job: native frames first where it asks for them."""
    modes, stopped = (" ".join(map(shlex.quote, m)) for m in (MODES[native], STOPPED_MODES))
    return TEMPLATE.replace("@MODES@", modes).replace("@STOPPED@", stopped)


def incidents_dir(journal_path: Path | None) -> Path | None:
    return journal_path.parent / "incidents" if journal_path is not None else None


def next_number(root: Path | None, in_bucket: set[int] = frozenset()) -> int:
    """One more than any incident with forensics here or in the bucket (a laptop that takes over
    from the watcher VM must not reuse the VM's numbers)."""
    taken = set(in_bucket)
    if root is not None:
        taken |= {int(p.name) for p in root.glob("*") if p.is_dir() and p.name.isdigit()}
    return max(taken, default=0) + 1


def collect(group: WorkerGroup, reason: str, native: bool = False) -> dict[str, str]:
    """Runs the script on every worker at once: file name -> text, one file per worker."""
    outcomes = group.run(as_root(script(native)), timeout=3 * SPY_TIMEOUT_S + 30)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    texts = {}
    for index, out in sorted(outcomes.items()):
        worker = group.by_index[index]
        head = f"worker {index} ({worker.instance or worker.host}), captured {stamp}: {reason}\n"
        if out.exited is None:
            body = f"(unreachable: {out.error})\n"
        else:
            body = out.stdout + (f"\n@@ stderr\n{out.stderr}" if out.stderr.strip() else "")
        texts[f"worker-{index}.txt"] = head + body
    return texts


def keep(texts: dict[str, str], root: Path | None, bucket=None) -> tuple[int, list[str], list[str]]:
    """Writes the files under root/<N>/ and, with a bucket (ops.watch.remote_state.RemoteState), to its
    `incidents/<N>/`; a bucket out of reach costs its copies, never the local ones. Returns
    (N, where each file went, what could not be stored)."""
    in_bucket: set[int] = set()
    failed: list[str] = []
    if bucket is not None:
        try:
            in_bucket = bucket.forensics_numbers()
        except STORAGE_ERRORS as err:
            failed.append(f"listing the bucket's incidents: {type(err).__name__}: {err}"[:300])
            bucket = None
    number = next_number(root, in_bucket)
    stored = []
    if root is not None:
        folder = root / str(number)
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            (folder / name).write_text(text)
            stored.append(str(folder / name))
    if bucket is not None:
        for name, text in texts.items():
            try:
                stored.append(bucket.put_forensics(number, name, text))
            except STORAGE_ERRORS as err:
                failed.append(f"{name} to the bucket: {type(err).__name__}: {err}"[:300])
    return number, stored, failed


def capture_hang(watcher, inc, bucket=None) -> None:
    """The watcher's hook: once per hang incident, before the restart; never blocks recovery.
    `bucket`: where the watch keeps its state (ops.watch.remote_state.RemoteState), if it does."""
    if inc.kind != "hang" or "forensics" in inc.phases:
        return
    started = time.time()
    inc.phases["forensics"] = started
    try:
        group = getattr(watcher, "group", None)  # whose probes just told the hang: no API call
        if group is None:
            workers = watcher.describe()
            group = watcher.workers(workers.workers if workers else None)
        texts = collect(group, inc.reason, native=watcher.config.rules.native_stacks)
        collected = time.time()
        number, files, failed = keep(texts, incidents_dir(watcher.journal.path), bucket)
    except Exception as err:  # noqa: BLE001 - evidence is a bonus; the restart must go on
        watcher.journal.event("error", f"hang forensics failed: {type(err).__name__}: {err}")
        return
    for line in failed:
        watcher.journal.event("error", f"hang forensics not stored: {line}")
    inc.phases["forensics"] = now = time.time()
    names = ", ".join(files) or "not stored (journal has no file, no bucket)"
    watcher.journal.event(
        "forensics",
        f"stacks and log tail of every worker's job in {now - started:.1f}s: {names}",
        incident=number,
        files=files,
        seconds=now - started,
        collect_s=round(collected - started, 3),  # the workers' stacks and logs, over SSH
        keep_s=round(now - collected, 3),  # the files written here and to the bucket
    )


def _by_worker(name: str) -> int:
    digits = name.rsplit("/", 1)[-1].removeprefix("worker-").removesuffix(".txt")
    return int(digits) if digits.isdigit() else 0


def show(state: Path, number: int, open_bucket: Callable[[], Any] | None = None) -> str:
    """What `tpupod logs --incident N` prints: every worker's file, in order; from the journal's
    directory, else from the bucket `open_bucket()` returns (where the watcher VM's forensics
    are: ops.watch.remote_state.RemoteState)."""
    folder = state / "incidents" / str(number)
    files = [(str(f), f.read_text()) for f in folder.glob("worker-*.txt")]
    known = {int(p.name) for p in folder.parent.glob("*") if p.name.isdigit()}
    where = [str(folder.parent)]
    if not files and open_bucket is not None:
        try:
            bucket = open_bucket()
            files = bucket.forensics(number)
            known |= bucket.forensics_numbers()
            where.append(f"gs://{bucket.bucket.name}/{bucket.prefix}incidents/")
        except Exception as err:  # noqa: BLE001 - whatever kept the bucket away goes in the line
            where.append(f"the bucket (not read: {' '.join(str(err).split())[:200]})")
    if not files:
        have = ", ".join(map(str, sorted(known))) or "none"
        raise FileNotFoundError(
            f"no forensics for incident {number} in {' or '.join(where)} "
            f"(incidents with forensics: {have})"
        )
    files.sort(key=lambda item: _by_worker(item[0]))
    return "\n".join(f"==> {name} <==\n{text}" for name, text in files)
