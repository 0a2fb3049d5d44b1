"""A JSON file written whole or not at all: the watcher's incident, a target's state, the
benches' results. Here, not beside any one of them, because every room of ops writes one."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: dict | list, indent: int | None = None) -> None:
    """JSON to `path` through a temp file and rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(data, out, sort_keys=True, default=str, indent=indent)
            out.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
