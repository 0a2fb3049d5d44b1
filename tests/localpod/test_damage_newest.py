"""The campaign's damaged-newest fault cuts the newest *verified* step's largest state file to
half, through the GCS emulator, and leaves every other object as it was."""

from __future__ import annotations

from localpod import storage
from localpod.faults import damage_newest

BUCKET = "damage-test"
PREFIX = "runs/local/r1/checkpoints"


class FakePod:
    run_prefix = "runs/local/r1"

    def __init__(self, url: str) -> None:
        self.url = url

    def endpoints(self) -> dict:
        return {"storage": self.url, "bucket": BUCKET}


def test_the_newest_verified_step_loses_half_its_largest_state_file():
    with storage.running_emulator(BUCKET) as url:
        objects = {
            f"{PREFIX}/10/tpupod-manifest.json": b"{}",
            f"{PREFIX}/10/state/small": b"s" * 10,
            f"{PREFIX}/20/tpupod-manifest.json": b"{}",
            f"{PREFIX}/20/state/small": b"s" * 10,
            f"{PREFIX}/20/state/large": b"L" * 1000,
            f"{PREFIX}/30/state/large": b"U" * 1000,  # committed, never verified: not newest
        }
        for name, data in objects.items():
            storage.upload(url, BUCKET, name, data, "application/octet-stream")
        assert damage_newest(FakePod(url)) == 20
        after = {o["name"]: o["size"] for o in storage.list_objects(url, BUCKET, PREFIX)}
        assert after.pop(f"{PREFIX}/20/state/large") == 500
        assert after == {name: len(data) for name, data in objects.items()
                         if name != f"{PREFIX}/20/state/large"}  # fmt: skip
