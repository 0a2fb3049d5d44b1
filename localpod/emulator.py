"""gcp-storage-emulator, in memory, without its per-write index dump.

The stock emulator rewrites its whole object index as one JSON file after every write, so each
write costs O(objects in the store): with Orbax writing hundreds of objects per checkpoint, a save
slowed from about a second to minutes as a run went on (24.5 ms against 0.6 ms per write at
1,300 objects). In memory nothing reads that file back, so we skip it; the server, its HTTP API
and its object storage are the stock ones.

`python -m localpod.emulator start --host 127.0.0.1 --port P --default-bucket B`
"""

from __future__ import annotations

import sys

from gcp_storage_emulator import storage
from gcp_storage_emulator.__main__ import main


def _skip_index_dump(self) -> None:
    """In memory the index file has no reader; the live index stays in the process."""


def run(argv: list[str]) -> int:
    storage.Storage._write_config_to_file = _skip_index_dump
    if "--in-memory" not in argv:
        argv = [*argv, "--in-memory"]
    return main(argv) or 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
