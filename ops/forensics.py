"""Hang forensics: before `watch` restarts a hung job, keep what the restart would destroy.

On every worker, as root (the trainer is root's; `sudo -n` when the login is not root): the Python
stacks of each Python process in the trainer's process tree (the trainerctl wrapper in
`trainer.pid` and its descendants), every thread, native frames where py-spy can read them (a
stopped process cannot be suspended: then `--nonblocking`; failing natives: local variables), and
the last lines of trainer.log. py-spy comes from the worker's own environment (the bundle's
`.venv`, where it is a trainer dependency) or the worker's PATH. One file per worker lands in
`<journal dir>/incidents/<N>/worker-<i>.txt`; the journal line `forensics` names them, and
`tpupod logs --stack S --incident N` prints them.
"""

from __future__ import annotations

import time
from pathlib import Path

from ops.workers import WorkerGroup, as_root

LOG_LINES = 80
SPY_TIMEOUT_S = 20
# Runs under bash as root with $TPUPOD_ROOT set (ops.workers.as_root).
SCRIPT = f"""R="$TPUPOD_ROOT"
p=$(cat "$R/trainer.pid" 2>/dev/null || true)
spy=
for c in "$R/current/.venv/bin/py-spy" "$(command -v py-spy 2>/dev/null)"; do
  if [ -n "$c" ] && [ -x "$c" ]; then spy=$c; break; fi
done
echo "@@ trainer.pid: ${{p:-none}}; py-spy: ${{spy:-not found}}"
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
  modes="--native --locals --nonblocking"
  case "$(cut -d' ' -f3 "/proc/$q/stat" 2>/dev/null)" in
    T|t) echo "(process stopped, e.g. SIGSTOP: read without suspending it)"; modes=--nonblocking;;
  esac
  ok=
  for mode in $modes; do
    if out=$(timeout {SPY_TIMEOUT_S} "$spy" dump --pid "$q" "$mode" 2>&1); then
      echo "$out"; ok=1; break
    fi
  done
  [ -n "$ok" ] || printf '(py-spy could not read the stacks)\n%s\n' "$out"
done
[ -n "$tree" ] || echo "(no trainer process alive)"
echo "@@ last {LOG_LINES} lines of trainer.log"
tail -n {LOG_LINES} "$R/trainer.log" 2>/dev/null || echo "(no trainer.log)"
"""


def incidents_dir(journal_path: Path | None) -> Path | None:
    return journal_path.parent / "incidents" if journal_path is not None else None


def next_number(root: Path) -> int:
    taken = [int(p.name) for p in root.glob("*") if p.is_dir() and p.name.isdigit()]
    return max(taken, default=0) + 1


def capture(group: WorkerGroup, root: Path | None, reason: str) -> tuple[int, list[Path]]:
    """Runs SCRIPT on every worker at once; one text file per worker under root/<N>/. Without a
    root (a journal with no file) nothing is written: (0, [])."""
    outcomes = group.run(as_root(SCRIPT), timeout=3 * SPY_TIMEOUT_S + 30)
    if root is None:
        return 0, []
    number = next_number(root)
    folder = root / str(number)
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    files = []
    for index, out in sorted(outcomes.items()):
        worker = group.by_index[index]
        head = f"worker {index} ({worker.instance or worker.host}), captured {stamp}: {reason}\n"
        if out.exited is None:
            body = f"(unreachable: {out.error})\n"
        else:
            body = out.stdout + (f"\n@@ stderr\n{out.stderr}" if out.stderr.strip() else "")
        path = folder / f"worker-{index}.txt"
        path.write_text(head + body)
        files.append(path)
    return number, files


def capture_hang(watcher, inc) -> None:
    """The watcher's hook: once per hang incident, before the restart; never blocks recovery."""
    if inc.kind != "hang" or "forensics" in inc.phases:
        return
    started = time.time()
    inc.phases["forensics"] = started
    try:
        workers = watcher._describe()
        group = watcher._workers(workers.workers if workers else None)
        root = incidents_dir(watcher.journal.path)
        number, files = capture(group, root, inc.reason)
    except Exception as err:  # noqa: BLE001 - evidence is a bonus; the restart must go on
        watcher.journal.event("error", f"hang forensics failed: {type(err).__name__}: {err}")
        return
    inc.phases["forensics"] = now = time.time()
    names = ", ".join(str(f) for f in files) or "not stored (journal has no file)"
    watcher.journal.event(
        "forensics",
        f"stacks and log tail of every worker's trainer in {now - started:.1f}s: {names}",
        incident=number,
        files=[str(f) for f in files],
        seconds=now - started,
    )


def show(state: Path, number: int) -> str:
    """What `tpupod logs --incident N` prints: every worker's file, in order."""
    folder = state / "incidents" / str(number)
    files = sorted(folder.glob("worker-*.txt"), key=lambda p: int(p.stem.split("-")[1]))
    if not files:
        known = sorted(int(p.name) for p in folder.parent.glob("*") if p.name.isdigit())
        have = ", ".join(map(str, known)) or "none"
        raise FileNotFoundError(f"no forensics for incident {number} in {folder.parent} "
                                f"(incidents with forensics: {have})")  # fmt: skip
    return "\n".join(f"==> {f} <==\n{f.read_text()}" for f in files)
