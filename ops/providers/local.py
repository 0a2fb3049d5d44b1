"""The local pod as an ops provider: a thin adapter over `localpod.pod.LocalPod`."""

from __future__ import annotations

from pathlib import Path

from localpod.pod import LocalPod
from localpod.state import PodError
from ops.provider import ProviderError, SliceInfo, Worker


class LocalProvider:
    """describe / recreate / delete on the pod in `pod_dir` (default `.tpupod/` or $TPUPOD_POD_DIR)."""

    name = "local"

    def __init__(self, pod: LocalPod | None = None, pod_dir: Path | str | None = None) -> None:
        self.pod = pod or LocalPod(pod_dir)

    def describe(self) -> SliceInfo:
        try:
            info = self.pod.describe()
        except PodError as err:
            raise ProviderError(str(err)) from None
        return SliceInfo(
            state=info.state,
            health=info.health,
            detail=info.detail,
            workers=[
                Worker(
                    index=w.index,
                    host=w.host,
                    port=w.port,
                    user=w.user,
                    key_filename=w.key_filename,
                )
                for w in info.workers
            ],
        )

    def recreate(self) -> None:
        """Delete (waiting for it, as the TPU API must finish a delete first), then create."""
        try:
            self.pod.recreate(wait=False)
        except PodError as err:
            raise ProviderError(str(err)) from None

    def delete(self) -> None:
        try:
            self.pod.delete(wait=True)
        except PodError as err:
            raise ProviderError(str(err)) from None
