"""Who acts in the local cloud, and the token file each one's clients can use.

`endpoints.json` `identities`: `operator` (the person at the terminal, the project's owner),
`worker-0` ... (each worker VM, as the stack's worker service account) and, once the watcher VM
is started, `watcher` (the stack's watcher service account); each `{email, token_file}`, the file
holding a token every local API accepts as that identity while the pod is up (gcloud
`--access-token-file FILE`; tpupod's operator clients read the operator's). The VMs themselves
get theirs from their metadata servers, as on GCP.
"""

from __future__ import annotations

from pathlib import Path

from localpod.gcp import tokens
from localpod.gcp.iam_policy import OPERATOR, Policy
from localpod.state import PodError, read_json, write_json

TOKENS_DIR = "iam/tokens"


def _identity(pod_dir: Path, key: bytes, name: str, email: str) -> dict:
    path = Path(pod_dir) / TOKENS_DIR / f"{name}.token"
    tokens.write_token_file(path, tokens.mint(key, email, tokens.FILE_LIFETIME_S))
    return {"email": email, "token_file": str(path)}


def for_pod(pod_dir: Path, key: bytes, policy: Policy, workers: int) -> dict[str, dict]:
    """The operator's and every worker's identity (token files written now)."""
    found = {"operator": _identity(pod_dir, key, "operator", OPERATOR.split(":", 1)[1])}
    account = policy.accounts.get("workers")
    if account is None:
        raise PodError(f"stack {policy.stack} declares no worker service account")
    for index in range(workers):
        found[f"worker-{index}"] = _identity(pod_dir, key, f"worker-{index}", account)
    return found


def add_watcher(pod_dir: Path, policy: Policy, endpoints: Path) -> dict:
    """The watcher's identity into endpoints.json (the watcher VM is starting)."""
    account = policy.accounts.get("watcher")
    if account is None:
        raise PodError(f"stack {policy.stack} declares no watcher (tpupod:watcher: false): "
                       "start the pod with a stack that has one (`--stack`)")  # fmt: skip
    identity = _identity(pod_dir, tokens.read_key(pod_dir), "watcher", account)
    published = read_json(endpoints) or {}
    published.setdefault("identities", {})["watcher"] = identity
    write_json(endpoints, published)
    return identity


def token(endpoints: dict, name: str) -> str:
    """Identity `name`'s token, from its file named in endpoints.json."""
    try:
        path = endpoints["identities"][name]["token_file"]
        return Path(path).read_text().strip()
    except (KeyError, TypeError, OSError) as err:
        raise PodError(
            f"no {name} token in the pod's endpoints ({err!r}); restart the pod"
        ) from None


def operator_token(endpoints: dict) -> str:
    """The operator's token (the pod's own calls: `pulumi up`'s part, the harness's)."""
    return token(endpoints, "operator")
