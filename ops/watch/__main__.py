"""`python -m ops.watch`: the recovery table as markdown (docs/recovery-table.md)."""

from ops.watch.table import markdown

print(markdown(), end="")
