"""localpod."""
