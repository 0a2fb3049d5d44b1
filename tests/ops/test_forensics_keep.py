"""Where hang forensics go when the bucket is out of reach: the local copies are written all the
same, numbered after what the bucket and this machine hold, and what failed is said. (The bucket
path itself runs against the pod's GCS emulator in tests/e2e/test_forensics.py and test_demo.py.)"""

from __future__ import annotations

from pathlib import Path

from ops.fleet.forensics import keep

TEXTS = {"worker-0.txt": "stacks of 0\n", "worker-1.txt": "stacks of 1\n"}


class Bucket:
    """The two calls ops.fleet.forensics makes of ops.watch.remote_state.RemoteState, failing on demand."""

    def __init__(self, numbers: set[int], list_error=None, put_error=None):
        self.numbers, self.list_error, self.put_error = numbers, list_error, put_error
        self.objects: dict[str, str] = {}

    def forensics_numbers(self) -> set[int]:
        if self.list_error:
            raise self.list_error
        return set(self.numbers)

    def put_forensics(self, number: int, name: str, text: str) -> str:
        if self.put_error:
            raise self.put_error
        uri = f"gs://b/ops/s/incidents/{number}/{name}"
        self.objects[uri] = text
        return uri


def test_numbers_follow_the_bucket_and_both_copies_are_named(tmp_path: Path):
    (tmp_path / "2").mkdir()
    bucket = Bucket({1, 4})  # the watcher VM's incidents: a laptop taking over goes on from 5
    number, stored, failed = keep(TEXTS, tmp_path, bucket)
    assert number == 5 and failed == []
    assert stored[:2] == [str(tmp_path / "5" / n) for n in TEXTS]
    assert stored[2:] == [f"gs://b/ops/s/incidents/5/{n}" for n in TEXTS]
    assert (tmp_path / "5" / "worker-1.txt").read_text() == "stacks of 1\n"


def test_a_bucket_out_of_reach_costs_only_its_copies(tmp_path: Path):
    number, stored, failed = keep(TEXTS, tmp_path, Bucket({7}, list_error=OSError("refused")))
    assert number == 1 and stored == [str(tmp_path / "1" / n) for n in TEXTS]
    assert len(failed) == 1 and "listing the bucket's incidents: OSError: refused" in failed[0]

    number, stored, failed = keep(TEXTS, tmp_path, Bucket({3}, put_error=OSError("503")))
    assert number == 4 and stored == [str(tmp_path / "4" / n) for n in TEXTS]
    assert failed == [f"{n} to the bucket: OSError: 503" for n in TEXTS]


def test_without_a_journal_file_only_the_bucket_keeps_them():
    bucket = Bucket(set())
    number, stored, failed = keep(TEXTS, None, bucket)
    assert (number, failed) == (1, []) and stored == list(bucket.objects)
