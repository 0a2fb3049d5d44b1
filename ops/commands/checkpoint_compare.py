"""Two runs' final committed checkpoints, compared leaf by leaf and bitwise: the proof that a run
which met faults trained exactly what an uninterrupted one did, for any job.

Generic by design: the newest committed step of each Orbax checkpoint directory is found by
Orbax, every item of that step that is a PyTree checkpoint is read back as numpy arrays from its
own metadata (no knowledge of the job's tree), and any other item (JSON, a data iterator's
state) is compared file by file (Orbax's commit markers, which hold times and paths, aside). `python -m ops.commands.checkpoint_compare DIR_A DIR_B` prints what
differs and exits 0 when all is equal, 1 when not, 2 when a directory cannot be read; the demo
runs it with the storage emulator's variables set.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field

from contract.checkpoint_manifest import COMMIT_FILES

LEAVES_SHOWN = 8
# Orbax's bookkeeping of a save (when and where it committed), not what was saved.
NOT_CONTENT = COMMIT_FILES


@dataclass
class Comparison:
    step_a: int | None
    step_b: int | None
    leaves: int = 0  # arrays compared
    files: int = 0  # other files compared
    differ: list[str] = field(default_factory=list)  # "item/leaf: why"

    @property
    def equal(self) -> bool:
        return self.step_a == self.step_b and self.step_a is not None and not self.differ

    def lines(self) -> list[str]:
        head = (f"final steps {self.step_a} and {self.step_b}: {self.leaves} arrays and "
                f"{self.files} files compared")  # fmt: skip
        if self.equal:
            return [f"{head}: bitwise equal"]
        if self.step_a != self.step_b:
            return [f"{head}: NOT equal (the runs ended at different steps)"]
        shown = self.differ[:LEAVES_SHOWN]
        more = len(self.differ) - len(shown)
        return [f"{head}: NOT equal, {len(self.differ)} differ", *(f"  {d}" for d in shown)] + (
            [f"  ... and {more} more"] if more else []
        )


def latest_step(directory: str) -> int | None:
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(read_only=True)
    return ocp.CheckpointManager(directory, options=options).latest_step()


def read_arrays(item) -> dict:
    """Leaf path -> numpy array of a PyTree checkpoint item, from its metadata alone."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    checkpointer = ocp.PyTreeCheckpointer()
    meta = checkpointer.metadata(item)
    tree = meta.item_metadata.tree if hasattr(meta, "item_metadata") else meta.tree
    as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    restored = checkpointer.restore(item, args=ocp.args.PyTreeRestore(tree, restore_args=as_numpy))
    leaves = jax.tree_util.tree_flatten_with_path(restored)[0]
    return {jax.tree_util.keystr(p, simple=True, separator="/"): leaf for p, leaf in leaves}


def files_under(item, base=None) -> dict[str, bytes]:
    """Relative path -> bytes of every file below `item`, walked level by level (GCS paths
    take no recursive glob)."""
    base = base or item
    found: dict[str, bytes] = {}
    for child in sorted(item.iterdir()):
        if child.is_dir():
            found.update(files_under(child, base))
        elif child.name not in NOT_CONTENT:
            found[str(child.relative_to(base))] = child.read_bytes()
    return found


def same_array(a, b) -> str | None:
    """None when bitwise equal, else why not."""
    import numpy as np

    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    if a.tobytes() == b.tobytes():
        return None
    if np.issubdtype(a.dtype, np.number):
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        return (
            f"{int(np.count_nonzero(diff))} of {a.size} values differ (max |diff| {diff.max():.3g})"
        )
    return "contents differ"


def compare(dir_a: str, dir_b: str) -> Comparison:
    from etils import epath

    result = Comparison(latest_step(dir_a), latest_step(dir_b))
    if not result.equal and result.step_a != result.step_b:
        return result
    if result.step_a is None:
        result.differ.append(f"no committed step in {dir_a} or {dir_b}")
        return result
    step_a = epath.Path(dir_a) / str(result.step_a)
    step_b = epath.Path(dir_b) / str(result.step_b)
    items_a = {p.name for p in step_a.iterdir() if p.is_dir()}
    items_b = {p.name for p in step_b.iterdir() if p.is_dir()}
    for name in sorted(items_a ^ items_b):
        result.differ.append(f"{name}: an item only one run saved")
    for name in sorted(items_a & items_b):
        a, b = step_a / name, step_b / name
        if (a / "_METADATA").exists():
            arrays_a, arrays_b = read_arrays(a), read_arrays(b)
            for leaf in sorted(arrays_a.keys() | arrays_b.keys()):
                result.leaves += 1
                if leaf not in arrays_a or leaf not in arrays_b:
                    result.differ.append(f"{name}/{leaf}: only in one run")
                elif why := same_array(arrays_a[leaf], arrays_b[leaf]):
                    result.differ.append(f"{name}/{leaf}: {why}")
        else:
            files_a, files_b = files_under(a), files_under(b)
            for rel in sorted(files_a.keys() | files_b.keys()):
                result.files += 1
                if files_a.get(rel) != files_b.get(rel):
                    result.differ.append(f"{name}/{rel}: file differs")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ops.commands.checkpoint_compare",
        description="Compare two runs' newest committed Orbax checkpoints, bitwise.",
    )
    parser.add_argument("dir_a", help="a checkpoint directory (local or gs://)")
    parser.add_argument("dir_b")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    args = parser.parse_args(argv)
    try:
        result = compare(args.dir_a, args.dir_b)
    except (OSError, ValueError, FileNotFoundError) as err:
        print(f"error: cannot compare {args.dir_a} and {args.dir_b}: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"equal": result.equal, "step_a": result.step_a, "step_b": result.step_b,
                          "leaves": result.leaves, "files": result.files,
                          "differ": result.differ}))  # fmt: skip
    else:
        print("\n".join(result.lines()))
    return 0 if result.equal else 1


if __name__ == "__main__":
    sys.exit(main())
