"""The `tpupod` CLI, one module per command group."""
