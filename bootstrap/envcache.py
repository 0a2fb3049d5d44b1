"""Environments from the stack's bucket: a recreated worker installs nothing from PyPI or GitHub.

A new TPU VM has an empty disk. Without this, every recreate downloads uv and every package of
the lock (about 1.2 GB with the `tpu` group) from the package index on every worker at once: an
index outage, a rate limit or a VPC without NAT turns each recovery into a failure. The first
worker 0 that builds an environment publishes the uv cache it built it from; every later boot
downloads that archive through Private Google Access, unpacking it as it arrives into a scratch
directory that becomes its cache only once the sha256 of every byte matches, and installs offline
(`uv sync --offline`).

Objects, per stack (workers may write only their own stack's envs/STACK/, an IAM condition) and
environment key (a hash of everything the environment depends on):
  envs/STACK/KEY.json            the manifest, written last, create-only: {object, sha256, bytes}
  envs/STACK/KEY/SHA256.tar.zst  the archive (zstd; gzip where the image has no zstd)
The sha256 catches an archive damaged or cut short in the bucket; it is no signature: whoever may
write envs/STACK/ (this stack's workers) decides what its later boots install.

    python3 -I -S envcache.py key KIND [--python PY] [FILE...]   print the key
    python3 -I -S envcache.py restore KEY DIR    0 restored; 3 none published; 4 refused; 5 error
    python3 -I -S envcache.py publish KEY DIR [--replace]        archive DIR, upload, then manifest

Standard library only (-I -S; a TPU image's Python 3.10 runs it). Reads MD_BUCKET, MD_STACK,
GCE_METADATA_HOST and, on the local pod, STORAGE_EMULATOR_HOST.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

RESTORED, ABSENT, REFUSED, FAILED = 0, 3, 4, 5
CHUNK = 1 << 20
ATTEMPTS = 4  # GCS answers 429 and 503 under load: retried with backoff, as its docs ask


def main(argv: list[str]) -> int:
    verb, rest = argv[0], argv[1:]
    if verb == "key":
        print(key(rest))
        return 0
    if verb == "restore":
        return restore(rest[0], rest[1])
    if verb == "publish":
        return publish(rest[0], rest[1], replace="--replace" in rest)
    print(f"envcache: unknown verb {verb}", file=sys.stderr)
    return 2


def key(args: list[str]) -> str:
    """sha256 over the kind, uv's version, the interpreter (version, build, machine) and the
    contents of the given files (lock, pyproject, requirements): 24 hex digits."""
    digest = hashlib.sha256(f"{args[0]}\nuv {os.environ.get('TPUPOD_UV_VERSION', '')}\n".encode())
    files = args[1:]
    if files[:1] == ["--python"]:
        probe = "import platform, sys; print(sys.version, sys.platform, platform.machine())"
        out = subprocess.run([files[1], "-I", "-S", "-c", probe], capture_output=True, text=True,
                             check=True)  # fmt: skip
        digest.update(out.stdout.encode())
        files = files[2:]
    for path in files:
        digest.update(f"\n{os.path.basename(path)}\n".encode())
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:24]


def restore(env_key: str, dest: str) -> int:
    where = f"gs://{_bucket()}/{_prefix()}{env_key}"
    try:
        manifest = json.loads(_get(f"{_prefix()}{env_key}.json"))
    except FileNotFoundError:
        print(f"no environment {env_key} in gs://{_bucket()} yet")
        return ABSENT
    except (OSError, ValueError) as err:
        print(f"environment {env_key}: manifest {where}.json unreadable ({_why(err)})")
        return REFUSED if isinstance(err, ValueError) else FAILED
    began = time.monotonic()
    parent = os.path.dirname(os.path.abspath(dest))
    os.makedirs(parent, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=parent, prefix=".envcache.") as tmp:
        tree = os.path.join(tmp, "tree")
        os.mkdir(tree)
        if (fmt := manifest.get("format", "zstd")) not in _COMPRESSOR:
            print(f"environment {env_key}: archive format {fmt!r} unknown: refused")
            return REFUSED
        try:
            got, unpack_error = _download_unpacking(manifest["object"], fmt, tree)
        except FileNotFoundError:
            print(f"environment {env_key}: its archive gs://{_bucket()}/{manifest['object']} "
                  "is missing: refused")  # fmt: skip
            return REFUSED
        except (OSError, KeyError) as err:
            print(f"environment {env_key}: download failed ({_why(err)})")
            return FAILED
        if got != manifest.get("sha256"):  # the tree unpacked so far is dropped with tmp
            print(f"environment {env_key}: refused gs://{_bucket()}/{manifest['object']}: its "
                  f"sha256 is {got[:16]}..., its manifest says {str(manifest.get('sha256'))[:16]}"
                  "... (damaged or replaced in the bucket)")  # fmt: skip
            return REFUSED
        if unpack_error is not None:
            print(f"environment {env_key}: archive does not unpack: {unpack_error[:200]}")
            return REFUSED
        shutil.rmtree(dest, ignore_errors=True)
        os.rename(tree, dest)
    mb = int(manifest.get("bytes", 0)) / 1e6
    print(f"environment {env_key} restored from gs://{_bucket()}/{manifest['object']} "
          f"({mb:.0f} MB, sha256 verified) in {time.monotonic() - began:.1f} s")  # fmt: skip
    return RESTORED


def publish(env_key: str, src: str, *, replace: bool) -> int:
    fmt = "zstd" if shutil.which("zstd") else "gzip"
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=".envcache.", dir=os.path.dirname(src)) as tmp:
        archive = os.path.join(tmp, "archive")
        pack = _tar(fmt, "-cf", archive, "-C", src, ".")
        if pack.returncode != 0:
            print(f"environment {env_key}: not published: tar failed: {pack.stderr.strip()[:200]}")
            return FAILED
        sha, size = _sha256(archive), os.path.getsize(archive)
        name = f"{_prefix()}{env_key}/{sha}.tar.{'zst' if fmt == 'zstd' else 'gz'}"
        manifest = {"key": env_key, "object": name, "sha256": sha, "bytes": size, "format": fmt,
                    "created": time.time()}  # fmt: skip
        try:
            _put(name, archive, "application/octet-stream")
            _put(f"{_prefix()}{env_key}.json", json.dumps(manifest).encode(), "application/json",
                 create_only=not replace)  # fmt: skip
        except FileExistsError:
            print(f"environment {env_key}: another worker published it first: kept that one")
            return RESTORED
        except OSError as err:
            print(f"environment {env_key}: not published ({_why(err)})")
            return FAILED
    print(f"environment {env_key} published to gs://{_bucket()}/{name} ({size / 1e6:.0f} MB, "
          f"{fmt}) in {time.monotonic() - began:.1f} s")  # fmt: skip
    return RESTORED


# -- GCS over its JSON API ----------------------------------------------------------------------


def _bucket() -> str:
    return os.environ["MD_BUCKET"]


def _prefix() -> str:
    return f"envs/{os.environ['MD_STACK']}/"


def _base() -> str:
    return os.environ.get("STORAGE_EMULATOR_HOST") or "https://storage.googleapis.com"


@functools.cache
def _token() -> str:
    """The VM's service-account token, once per run: a run lasts minutes, a token an hour."""
    host = os.environ.get("GCE_METADATA_HOST", "metadata.google.internal")
    url = f"http://{host}/computeMetadata/v1/instance/service-accounts/default/token"
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
    with opener.open(request, timeout=10) as resp:
        return json.load(resp)["access_token"]


def _open(request: urllib.request.Request, timeout: float = 600):
    """urlopen with GCS's retry advice (429, 5xx, dropped connections); 404 is FileNotFoundError
    and a failed create-only precondition (412) FileExistsError."""
    request.add_header("Authorization", f"Bearer {_token()}")
    for attempt in range(ATTEMPTS):
        try:
            return urllib.request.urlopen(request, timeout=timeout)
        except urllib.error.HTTPError as err:
            if err.code == 404:
                raise FileNotFoundError(request.full_url) from None
            if err.code == 412:
                raise FileExistsError(request.full_url) from None
            if err.code != 429 and err.code < 500 or attempt == ATTEMPTS - 1:
                raise
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            if attempt == ATTEMPTS - 1:
                raise
        time.sleep(2**attempt)
        if hasattr(request.data, "seek"):
            request.data.seek(0)
    raise AssertionError("unreachable")


def _object_url(name: str) -> str:
    return f"{_base()}/storage/v1/b/{_bucket()}/o/{urllib.parse.quote(name, safe='')}?alt=media"


def _get(name: str) -> bytes:
    with _open(urllib.request.Request(_object_url(name))) as resp:
        return resp.read()


def _download_unpacking(name: str, fmt: str, tree: str) -> tuple[str, str | None]:
    """Streams the object into tar as it arrives, so unpacking overlaps the download instead of
    following it (1.2 GB with the `tpu` group), and hashes every byte on the way. Returns the
    sha256 and tar's error (None: it unpacked). Nothing in `tree` may be used before the caller
    has compared the sha256: a damaged archive can unpack partly before tar notices."""
    digest = hashlib.sha256()
    with tempfile.TemporaryFile() as errors:
        tar = subprocess.Popen(
            ["tar", f"--use-compress-program={_COMPRESSOR[fmt]}", "-xf", "-", "-C", tree],
            stdin=subprocess.PIPE, stderr=errors,
        )  # fmt: skip
        try:
            with _open(urllib.request.Request(_object_url(name))) as resp:
                while chunk := resp.read(CHUNK):
                    digest.update(chunk)
                    if not tar.stdin.closed:
                        try:
                            tar.stdin.write(chunk)
                        except BrokenPipeError:  # tar gave up: hash the rest, say why below
                            tar.stdin.close()
        except BaseException:
            tar.kill()
            raise
        finally:
            with contextlib.suppress(BrokenPipeError):
                tar.stdin.close()
            tar.wait()
        errors.seek(0)
        lines = errors.read().decode(errors="replace").splitlines()
        said = "; ".join(line.strip() for line in lines if line.strip())  # one line
    if tar.returncode == 0:
        return digest.hexdigest(), None
    return digest.hexdigest(), said or f"tar exit {tar.returncode}"


def _put(name: str, data: str | bytes, content_type: str, *, create_only: bool = False) -> None:
    query = {"uploadType": "media", "name": name}
    if create_only:
        query["ifGenerationMatch"] = "0"
    url = f"{_base()}/upload/storage/v1/b/{_bucket()}/o?{urllib.parse.urlencode(query)}"
    headers = {"Content-Type": content_type}
    if isinstance(data, bytes):
        with _open(urllib.request.Request(url, data=data, method="POST", headers=headers)):
            return
    headers["Content-Length"] = str(os.path.getsize(data))
    with open(data, "rb") as body:
        request = urllib.request.Request(url, data=body, method="POST", headers=headers)
        with _open(request):
            return


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


_COMPRESSOR = {"zstd": "zstd -T0 -3", "gzip": "gzip -1"}


def _tar(fmt: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["tar", f"--use-compress-program={_COMPRESSOR[fmt]}", *args],
                          capture_output=True, text=True)  # fmt: skip


def _why(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}".splitlines()[0][:200]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
