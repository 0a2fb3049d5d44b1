"""The local GCS emulator serves a read while another client drains a large object slowly, as
GCS does: in every recreate one worker's environment download (185 MB) used to hold its peer's
manifest GET for seconds, a cost the local pod added and GCP does not have.

Shown able to fail: with the reply sent under the emulator's lock (the code before this test),
the small GET below times out."""

from __future__ import annotations

import http.client
import time
import urllib.request
from urllib.parse import urlsplit

from localpod.gcp import storage

BUCKET = "tpupod-concurrent"
BIG = 16 << 20  # far past loopback's socket buffers: the reply's write blocks on its reader


def test_a_small_read_is_served_while_a_large_one_waits_for_its_reader():
    big = bytes(range(256)) * (BIG // 256)
    with storage.running_emulator(BUCKET) as url:
        storage.upload(url, BUCKET, "envs/big.tar", big, "application/octet-stream")
        storage.upload(url, BUCKET, "envs/small.json", b'{"k": 1}', "application/json")
        media = f"/storage/v1/b/{BUCKET}/o/%s?alt=media"
        parts = urlsplit(url)
        stalled = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        try:
            stalled.request("GET", media % "envs%2Fbig.tar")
            time.sleep(0.5)  # the emulator is now writing the big reply to a reader that waits
            began = time.monotonic()
            with urllib.request.urlopen(url + media % "envs%2Fsmall.json", timeout=5) as resp:
                assert resp.read() == b'{"k": 1}'
            assert time.monotonic() - began < 2.0
            reply = stalled.getresponse()
            assert reply.status == 200
            assert reply.read() == big  # the stalled reply was whole, only late
        finally:
            stalled.close()
