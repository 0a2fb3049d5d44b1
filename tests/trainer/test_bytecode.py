"""Bytecode for a new venv (trainer/bytecode.py): a published archive restores into a venv that
has none, real interpreters then load those pycs instead of compiling, a changed source is never
run from a stale pyc, and a restore writes nothing but new pycs inside the venv."""

from __future__ import annotations

import importlib.util
import io
import json
import marshal
import os
import py_compile
import subprocess
import sys
import tarfile
from pathlib import Path

from trainer import bytecode, bytecode_publish

SCRIPT = Path(bytecode.__file__)
TAG = sys.implementation.cache_tag


def make_venv(root: Path) -> Path:
    venv = root / "venv"
    pkg = bytecode.site_packages(venv) / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("VALUE = 'v1'\n")
    (bytecode.site_packages(venv) / "pkg-1.0.dist-info").mkdir()
    return venv


def run_python(venv: Path, code: str, write_bytecode: bool = False, *args: str):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    env["PYTHONPATH"] = str(bytecode.site_packages(venv))
    if write_bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run(
        [sys.executable, *args, "-c", code], env=env, capture_output=True, text=True, check=True
    )


def import_mod(venv: Path) -> tuple[str, bool]:
    """pkg.mod's VALUE in a fresh interpreter, and whether its code came from the pyc."""
    out = run_python(venv, "import pkg.mod; print(pkg.mod.VALUE)", False, "-v")
    pyc = bytecode.site_packages(venv) / "pkg" / "__pycache__" / f"mod.{TAG}.pyc"
    return out.stdout.strip(), f"code object from '{pyc}'" in out.stderr


def publish(venv: Path, cache: Path) -> subprocess.CompletedProcess:
    """As a job's launcher has it done once the job imported pkg.mod (whose pycs Python wrote)
    into a venv whose restore found no archive (the marker says so, unless already written)."""
    run_python(venv, "import pkg.mod", True)
    marker = venv / bytecode.MARKER
    if not marker.exists():
        marker.write_text(json.dumps({"found": False, "restored": 0}))
    return subprocess.run(
        [sys.executable, "-m", "trainer.bytecode_publish", str(cache), "--venv", str(venv)],
        capture_output=True,
        text=True,
        check=True,
    )


def restore(venv: Path, cache: Path) -> str:
    """As the bootstrap does it: the file itself, stdlib only (-I -S)."""
    out = subprocess.run(
        [sys.executable, "-I", "-S", str(SCRIPT), "restore", str(cache), "--venv", str(venv)],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def drop_bytecode(venv: Path) -> None:
    for pyc in bytecode.site_packages(venv).rglob("*.pyc"):
        pyc.unlink()


def test_published_bytecode_restores_into_a_new_venv_and_is_loaded(tmp_path):
    venv, cache = make_venv(tmp_path), tmp_path / "compile-cache"
    # The job's imports wrote timestamp pycs; the archive re-heads them (checked-hash).
    out = publish(venv, cache)
    assert import_mod(venv) == ("v1", True)
    uri = bytecode.archive_uri(str(cache), venv)
    assert "published 2 modules" in out.stderr and Path(uri).is_file()
    drop_bytecode(venv)
    (venv / bytecode.MARKER).unlink()  # a new venv
    assert import_mod(venv) == ("v1", False)

    line = restore(venv, cache)
    assert line.startswith(f"bytecode: restored 2 modules from {uri}"), line
    marker = json.loads((venv / bytecode.MARKER).read_text())
    assert marker["found"] is True and marker["restored"] == 2
    assert import_mod(venv) == ("v1", True)
    pyc = bytecode.site_packages(venv) / "pkg" / "__pycache__" / f"mod.{TAG}.pyc"
    assert int.from_bytes(pyc.read_bytes()[4:8], "little") == 0b11  # checked-hash
    # Once per venv.
    assert restore(venv, cache).startswith("bytecode: already handled")


def test_a_changed_source_is_never_run_from_a_restored_pyc(tmp_path):
    venv, cache = make_venv(tmp_path), tmp_path / "compile-cache"
    publish(venv, cache)
    drop_bytecode(venv)
    (venv / bytecode.MARKER).unlink()  # a new venv
    restore(venv, cache)
    assert import_mod(venv) == ("v1", True)
    (bytecode.site_packages(venv) / "pkg" / "mod.py").write_text("VALUE = 'v2'\n")
    assert import_mod(venv) == ("v2", False)


def test_publish_leaves_an_existing_archive_alone(tmp_path):
    venv, cache = make_venv(tmp_path), tmp_path / "compile-cache"
    publish(venv, cache)
    archive = Path(bytecode.archive_uri(str(cache), venv))
    before = archive.stat().st_mtime_ns
    (venv / bytecode.MARKER).write_text(json.dumps({"found": False, "restored": 0}))
    assert publish(venv, cache).stderr == ""
    assert archive.stat().st_mtime_ns == before
    # found there: marked, so this venv's later trainers do not look again
    assert json.loads((venv / bytecode.MARKER).read_text()) == {
        "found": False, "restored": 0, "published": True}  # fmt: skip


def test_no_archive_yet_is_recorded_and_the_key_follows_the_environment(tmp_path):
    venv, cache = make_venv(tmp_path), tmp_path / "compile-cache"
    uri = bytecode.archive_uri(str(cache), venv)
    assert restore(venv, cache) == f"bytecode: none at {uri} yet (the first job publishes it)"
    assert json.loads((venv / bytecode.MARKER).read_text())["found"] is False
    # Another set of installed distributions is another archive.
    (bytecode.site_packages(venv) / "other-2.0.dist-info").mkdir()
    assert bytecode.archive_uri(str(cache), venv) != uri


def test_restore_writes_only_new_pycs_inside_the_venv(tmp_path):
    venv, cache = make_venv(tmp_path), tmp_path / "compile-cache"
    sp = bytecode.site_packages(venv).relative_to(venv).as_posix()
    # An existing pyc hardlinked elsewhere (as uv links a venv to its cache) keeps its bytes.
    (bytecode.site_packages(venv) / "pkg" / "__pycache__").mkdir()
    linked = tmp_path / "uv-cache-file"
    linked.write_bytes(b"cache bytes")
    os.link(linked, bytecode.site_packages(venv) / "pkg" / "__pycache__" / f"mod.{TAG}.pyc")
    members = {
        f"{sp}/pkg/__pycache__/mod.{TAG}.pyc": b"replacement",
        f"{sp}/pkg/__pycache__/__init__.{TAG}.pyc": b"new",
        f"{sp}/nopkg/__pycache__/x.{TAG}.pyc": b"no package directory",
        f"{sp}/pkg/evil.py": b"not a pyc",
        "../outside/__pycache__/x.pyc": b"outside",
        "/abs/__pycache__/x.pyc": b"absolute",
        "bin/__pycache__/x.pyc": b"not under lib",
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, body in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    archive = Path(bytecode.archive_uri(str(cache), venv))
    archive.parent.mkdir(parents=True)
    archive.write_bytes(buf.getvalue())

    assert restore(venv, cache).startswith("bytecode: restored 1 modules")
    assert linked.read_bytes() == b"cache bytes"
    new = bytecode.site_packages(venv) / "pkg" / "__pycache__" / f"__init__.{TAG}.pyc"
    assert new.read_bytes() == b"new"
    assert not (bytecode.site_packages(venv) / "nopkg").exists()
    assert not (bytecode.site_packages(venv) / "pkg" / "evil.py").exists()
    assert not (tmp_path / "outside").exists() and not (venv / "bin").exists()


def test_an_unreadable_archive_is_one_line_and_the_next_publish_replaces_it(tmp_path):
    venv, cache = make_venv(tmp_path), tmp_path / "compile-cache"
    archive = Path(bytecode.archive_uri(str(cache), venv))
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"\x1f\x8b not really gzip")
    line = restore(venv, cache)
    assert line.startswith(f"bytecode: {archive} is unreadable (") and "publishes a new" in line
    marker = json.loads((venv / bytecode.MARKER).read_text())
    assert marker["found"] is False and marker["unreadable"] is True and marker["restored"] == 0
    # The next publisher, told so by the marker, writes over it (it leaves a readable one alone).
    assert "published 2 modules" in publish(venv, cache).stderr
    drop_bytecode(venv)
    (venv / bytecode.MARKER).unlink()
    assert restore(venv, cache).startswith("bytecode: restored 2 modules")


def test_a_pyc_written_in_its_sources_second_is_compiled_again_not_reused(tmp_path):
    """Python trusts a timestamp pyc on the source's mtime (whole seconds) and size; one written
    within that same second may predate a same-size rewrite, so the publisher compiles."""
    venv = make_venv(tmp_path)
    source = bytecode.site_packages(venv) / "pkg" / "mod.py"
    pyc = bytecode.site_packages(venv) / "pkg" / "__pycache__" / f"mod.{TAG}.pyc"
    pyc.parent.mkdir()
    # Bytecode of an older text of the same size, headed for the current mtime and size.
    stale = compile("VALUE = 'v0'\n", str(source), "exec")
    st = source.stat()
    header = importlib.util.MAGIC_NUMBER + bytes(4)
    header += (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") + st.st_size.to_bytes(
        4, "little"
    )
    pyc.write_bytes(header + marshal.dumps(stale))

    def value(pyc_written_at: float) -> str:
        os.utime(pyc, (pyc_written_at, pyc_written_at))
        namespace: dict = {}
        exec(marshal.loads(bytecode_publish.hash_pyc(str(source))[16:]), namespace)
        return namespace["VALUE"]

    assert value(int(st.st_mtime) + 0.5) == "v1"  # same second: compiled from the source
    assert value(int(st.st_mtime) + 5) == "v0"  # later: Python's own pyc, taken as current


def test_the_publisher_takes_what_the_job_imported_only_when_its_venv_found_no_archive(tmp_path):
    """The modules with a pyc in the venv (what the job imported since the venv was made: 600
    here, and one never imported) go into the archive; a venv whose restore found an archive,
    or that published already, publishes nothing."""
    venv, cache = make_venv(tmp_path), tmp_path / "compile-cache"
    pkg = bytecode.site_packages(venv) / "pkg"
    names = [f"m{i:03d}_{'x' * 120}" for i in range(600)]
    for name in names:
        (pkg / f"{name}.py").write_text(f"NAME = {name!r}\n")
        py_compile.compile(str(pkg / f"{name}.py"), doraise=True)  # as an import writes it
    (pkg / "never_imported.py").write_text("X = 1\n")

    def publish() -> subprocess.CompletedProcess:
        command = [
            sys.executable,
            "-m",
            "trainer.bytecode_publish",
            str(cache),
            "--venv",
            str(venv),
        ]
        return subprocess.run(command, capture_output=True, text=True, timeout=300,
                              cwd=Path(bytecode.__file__).parents[1])  # fmt: skip

    uri = Path(bytecode.archive_uri(str(cache), venv))
    (venv / bytecode.MARKER).write_text(json.dumps({"found": True, "restored": 1}))
    assert publish().returncode == 0 and not uri.exists()
    (venv / bytecode.MARKER).write_text(json.dumps({"found": False, "restored": 0}))
    done = publish()
    assert done.returncode == 0 and "published 600 modules" in done.stderr, done.stderr
    # Published: the marker says so, and the next start in this venv publishes nothing.
    assert json.loads((venv / bytecode.MARKER).read_text())["published"] is True
    stamp = uri.stat().st_mtime_ns
    assert publish().returncode == 0 and uri.stat().st_mtime_ns == stamp
    with tarfile.open(uri) as tar:
        members = set(tar.getnames())
    sp = bytecode.site_packages(venv).relative_to(venv).as_posix()
    assert {f"{sp}/pkg/__pycache__/{n}.{TAG}.pyc" for n in names} == members
