"""`python -m ops.watch`: the recovery table as markdown (docs/recovery-table.md)."""

from ops.watch.drawing import markdown

print(markdown(), end="")
