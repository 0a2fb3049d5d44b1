"""The job's supervisor on a worker: `jobctl.sh` starts it (under systemd, or setsid) as the
leader of the job's process group, with the bundle's Python in isolated mode (stdlib only).

1. It reads what the bootstrap wrote under $TPUPOD_ROOT: `job.json` (the spec), `job.env` (the
   contract's variables), `job.venv` (the job's Python environment), `job.attempt`.
2. It reads the job's secrets from Secret Manager with the VM's token, into the job's environment
   only: never a file, an argument or a log line.
3. It runs `run` with bash in the job directory. Bash's own TERM trap waits for the command that
   runs and then exits with its status: a shell layer never exits 143 while the program saves.
4. The job writes its output to this attempt's log file (contract.layout.local_attempt_log), never
   through a pipe: a launcher that dies leaves the job running. The launcher follows that file:
   into `job.log` (every attempt), to the run's bucket after FIRST_UPLOAD_S and every LOG_UPLOAD_S
   (contract.layout.attempt_log: a preempted VM's disk is gone), and with
   `progress: {regex}` the last step it reads goes to the status file.
5. In tpupod's worker environment (`python: none`), once the job reports its first progress,
   it starts trainer/bytecode_publish.py: the bytecode of what the job imported goes to the
   bucket for a re-created worker's new venv (trainer/bytecode.py).
6. A SIGTERM to the group (a preemption, `jobctl.sh stop`) is noted in `job.term`: an exit 0
   after it is a preemption, not done. Then it waits for the job, writes `job.exit`, and exits
   with the job's code.

`jobrun.py reference RUN_ID` runs the job once in the foreground as run RUN_ID (its own run
directory and status file, attempt 1): the uninterrupted run `tpupod demo` compares against.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

# Run isolated (`python -I -S`, no site-packages) from the code bundle: its root holds contract/,
# stdlib-only, where the run directory's layout is spelled once.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from contract import layout  # noqa: E402

ROOT = os.environ.get("TPUPOD_ROOT", "/var/lib/tpupod")
LOG_UPLOAD_S = 10.0
FIRST_UPLOAD_S = 2.0  # the attempt's first lines (its start, the contract) reach the bucket soon
FOLLOW_S = 0.2  # how often the job's output is read (progress, job.log)
LOG_UPLOAD_MAX = 16 * 1024 * 1024  # the tail that goes to the bucket when a log grows past it
SECRETS_URL = "https://secretmanager.googleapis.com"
CALL_TIMEOUT = 20.0
# bash: run the command line; on SIGTERM finish the command that runs, then exit with its status.
SHELL_PROLOGUE = "trap 'exit' TERM\n"


def path(name: str) -> str:
    return os.path.join(ROOT, name)


def read_env_file(file: str) -> dict[str, str]:
    """KEY=VALUE lines (values may hold spaces and '='); never sourced."""
    found = {}
    with open(file) as f:
        for line in f:
            key, sep, value = line.rstrip("\n").partition("=")
            if sep and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                found[key] = value
    return found


def write_atomic(file: str, text: str) -> None:
    tmp = f"{file}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, file)


# -- Google APIs, through the VM's metadata server (no client library on this path) -------------
def metadata(contract: dict[str, str], key: str) -> str:
    host = contract.get("GCE_METADATA_HOST") or "metadata.google.internal"
    request = urllib.request.Request(
        f"http://{host}/computeMetadata/v1/{key}", headers={"Metadata-Flavor": "Google"}
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=CALL_TIMEOUT) as response:
        return response.read().decode()


_token: list = ["", 0.0]  # the VM's access token and when to ask for a new one


def token(contract: dict[str, str]) -> str:
    """The VM's access token, asked for again a minute before it expires."""
    if time.time() >= _token[1]:
        raw = json.loads(metadata(contract, "instance/service-accounts/default/token"))
        _token[:] = [raw["access_token"], time.time() + float(raw.get("expires_in", 300)) - 60]
    return _token[0]


def read_secret(contract: dict[str, str], project: str, secret: str) -> str:
    """The latest version of `secret` (projects.secrets.versions.access)."""
    base = contract.get("TPUPOD_SECRETMANAGER_ENDPOINT") or SECRETS_URL
    url = f"{base.rstrip('/')}/v1/projects/{project}/secrets/{secret}/versions/latest:access"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token(contract)}"})
    with urllib.request.urlopen(request, timeout=CALL_TIMEOUT) as response:
        payload = json.loads(response.read())["payload"]["data"]
    return base64.b64decode(payload).decode()


def gcs_upload(contract: dict[str, str], uri: str, data: bytes) -> None:
    """One object, whole (uploadType=media), at gs://BUCKET/NAME."""
    bucket, _, name = uri[len("gs://") :].partition("/")
    base = contract.get("STORAGE_EMULATOR_HOST") or "https://storage.googleapis.com"
    query = urllib.parse.urlencode({"uploadType": "media", "name": name})
    request = urllib.request.Request(
        f"{base.rstrip('/')}/upload/storage/v1/b/{bucket}/o?{query}",
        data=data,
        method="POST",
        headers={"Authorization": f"Bearer {token(contract)}", "Content-Type": "text/plain"},
    )
    with urllib.request.urlopen(request, timeout=CALL_TIMEOUT):
        pass


def secrets(spec: dict, contract: dict[str, str]) -> dict[str, str]:
    """Every secret the job names, or SystemExit naming the one that could not be read."""
    if not spec.get("secrets"):
        return {}
    values = {}
    for var, secret in sorted(spec["secrets"].items()):
        try:
            project = metadata(contract, "project/project-id")
            values[var] = read_secret(contract, project, secret)
        except (OSError, ValueError, KeyError) as err:
            why = getattr(err, "code", None) or type(err).__name__
            raise SystemExit(
                f"jobrun: cannot read secret {secret} (for ${var}) from Secret Manager: {why}; "
                "grant the workers' service account roles/secretmanager.secretAccessor on it"
            ) from None
    return values


# -- the job's environment ----------------------------------------------------------------------
def job_environment(spec: dict, contract: dict[str, str], venv: str, attempt: int) -> dict:
    """The worker's own environment, the contract, the job's env, then its secrets."""
    env = dict(os.environ)
    for name in ("VIRTUAL_ENV", "PYTHONHOME", "UV_PROJECT_ENVIRONMENT"):
        env.pop(name, None)
    env.update(contract)
    env["TPUPOD_ATTEMPT"] = str(attempt)
    env.setdefault("PYTHONUNBUFFERED", "1")  # progress lines as they are printed
    env.update(spec.get("env") or {})
    env["VIRTUAL_ENV"] = venv
    env["PATH"] = f"{venv}/bin:{env.get('PATH') or '/usr/local/bin:/usr/bin:/bin'}"
    bundle = os.path.realpath(path("current"))
    # tpupod_job on every job's path; tpupod's own packages only in its own environment.
    extra = [os.path.join(bundle, "bootstrap", "jobkit")]
    if spec.get("python") == "none":
        extra.append(bundle)
    if env.get("PYTHONPATH"):
        extra.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(extra)
    return env


class Output:
    """The job's output: followed from the attempt's log file into job.log (and the journal
    under systemd), read for progress, shipped to the bucket."""

    def __init__(self, log: str, attempt_log: str, upload, regex: str | None, status: str | None):
        self.log = open(log, "ab")  # noqa: SIM115 - open for the whole run
        self.attempt_path = attempt_log
        self.reader = open(attempt_log, "rb")  # noqa: SIM115
        self.upload, self.status = upload, status
        self.pattern = re.compile(regex.encode()) if regex else None
        self.echo = bool(os.environ.get("INVOCATION_ID"))  # under systemd: to the journal too
        self.partial = b""
        self.step: int | None = None
        self.sent = -1

    def note(self, line: str) -> None:
        """A line of the launcher's own, in the attempt's log like the job's."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with open(self.attempt_path, "ab") as f:
            f.write(f"jobrun: {stamp} {line}\n".encode())

    def follow(self) -> None:
        """What the job wrote since the last call."""
        chunk = self.reader.read()
        if not chunk:
            return
        self.log.write(chunk)
        self.log.flush()
        if self.echo:
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
        if self.pattern is not None:
            self._progress(chunk)

    def _progress(self, chunk: bytes) -> None:
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()[-4096:]
        step = None
        for line in lines:
            for match in self.pattern.finditer(line):
                try:
                    step = int(match.group(1))
                except (TypeError, ValueError):
                    continue
        if step is not None and step != self.step and self.status:
            self.step = step
            doc = {"state": "training", "step": step, "time": time.time(), "source": "output"}
            write_atomic(self.status, json.dumps(doc))

    def ship(self) -> None:
        """The attempt's log to the bucket when it grew (its tail past LOG_UPLOAD_MAX)."""
        size = os.path.getsize(self.attempt_path)
        if size == self.sent:
            return
        with open(self.attempt_path, "rb") as f:
            f.seek(max(0, size - LOG_UPLOAD_MAX))
            data = f.read()
        self.upload(data)
        self.sent = size

    def close(self) -> None:
        self.follow()
        self.log.close()
        self.reader.close()


def shipper(output: Output, stop: threading.Event) -> None:
    said, wait = False, FIRST_UPLOAD_S
    while not stop.wait(wait):
        wait = LOG_UPLOAD_S
        try:
            output.ship()
        except (OSError, ValueError) as err:
            if not said:  # once per attempt: the log stays on the worker meanwhile
                said = True
                output.note(f"log upload failed ({err}); retrying every {LOG_UPLOAD_S:g}s")


def progressed(output: Output) -> bool:
    """The job reported progress: its output matched (regex), or its status file says it
    trains (written by the job itself)."""
    if output.step is not None:
        return True
    try:
        with open(output.status) as f:
            return json.load(f).get("state", "training") in ("training", "saving")
    except (OSError, ValueError, TypeError, AttributeError):
        return False


def publish_bytecode(spec: dict, contract: dict[str, str], venv: str, log: str):
    """In tpupod's worker environment only (the bootstrap restores bytecode there): the
    publisher, at the lowest priority; it decides from the venv's marker whether to publish."""
    bundle = os.path.realpath(path("current"))
    cache = contract.get("TPUPOD_COMPILE_CACHE", "off")
    if spec.get("python") != "none" or cache in ("", "off"):
        return None
    env = {**os.environ, **contract, "PYTHONPATH": bundle}
    with open(log, "ab") as out:
        return subprocess.Popen([os.path.join(venv, "bin", "python"), "-m",
                                 "trainer.bytecode_publish", cache, "--venv", venv],
                                cwd="/", env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=out)  # fmt: skip


def exit_code(returncode: int) -> int:
    """A signal's death as a shell reports it (SIGKILL: 137)."""
    return 128 - returncode if returncode < 0 else returncode


class Attempt:
    """One attempt's files and output, as `run` and a promoted standby both begin it."""

    def __init__(self, reference: str | None = None):
        with open(path("job.json")) as f:
            self.spec = json.load(f)
        self.contract = contract = read_env_file(path("job.env"))
        with open(path("job.venv")) as f:
            self.venv = f.read().strip()
        self.reference, self.number = reference, 1
        if reference is None:
            self.number = current_attempt()
        else:  # its own run: its own directories (bucket and local tier), status file and log
            parent = contract["TPUPOD_RUN_DIR"].rsplit("/", 1)[0]
            contract.update(TPUPOD_RUN_ID=reference, TPUPOD_RUN_DIR=f"{parent}/{reference}",
                            TPUPOD_CHECKPOINT_DIR=layout.checkpoint_dir(f"{parent}/{reference}"),
                            TPUPOD_LOCAL_CHECKPOINT_DIR=layout.local_checkpoint_dir(ROOT, reference),
                            TPUPOD_STATUS_FILE=path("reference-status.json"))  # fmt: skip
        self.job_dir = os.path.join(os.path.realpath(path("current")), "job")

    def environment(self) -> dict:
        return job_environment(self.spec, self.contract, self.venv, self.number)

    def begin(self) -> Output:
        """The attempt's log (created empty), its output follower and its first note; the status
        file of an older attempt removed; SIGTERM noted in job.term from now on."""
        name = "reference" if self.reference else "job"
        worker = self.contract.get("TPUPOD_PROCESS_ID", "0")
        log_uri = layout.attempt_log(self.contract["TPUPOD_RUN_DIR"], self.number, worker)
        os.makedirs(path("logs"), exist_ok=True)
        status = self.contract.get("TPUPOD_STATUS_FILE")
        if status and os.path.exists(status):
            os.unlink(status)  # an older attempt's progress is not this one's
        self.log = path(layout.local_attempt_log(name, self.number))
        with open(self.log, "wb"):
            pass
        spec = self.spec
        regex = spec["progress"]["regex"] if isinstance(spec.get("progress"), dict) else None
        output = Output(path(f"{name}.log"), self.log,
                        lambda data: gcs_upload(self.contract, log_uri, data), regex,
                        status)  # fmt: skip
        self.termed = threading.Event()

        def on_term(signum, frame) -> None:  # the group got it too: the job saves, then exits
            if not self.termed.is_set() and self.reference is None:
                write_atomic(path("job.term"), f"{time.time()}\n")
            self.termed.set()

        signal.signal(signal.SIGTERM, on_term)
        output.note(f"attempt {self.number} of run {self.contract.get('TPUPOD_RUN_ID')}: "
                    f"{spec['run']}")  # fmt: skip
        return output


def current_attempt() -> int:
    try:
        with open(path("job.attempt")) as f:
            return max(1, int(f.read().strip() or 1))
    except (OSError, ValueError):
        return 1


def run(reference: str | None = None) -> int:
    attempt = Attempt(reference)
    output = attempt.begin()
    try:
        env = attempt.environment()
        env.update(secrets(attempt.spec, attempt.contract))
    except SystemExit as err:
        output.note(str(err))
        output.close()
        return finish(reference, 1)
    child = launch(attempt, env)
    del env  # the secrets live on in the child's environment only
    return supervise(attempt, output, child)


def launch(attempt: Attempt, env: dict) -> subprocess.Popen:
    """The attempt's run line, cold: its own interpreter under bash."""
    with open(attempt.log, "ab") as out:  # O_APPEND: the job's writes and the notes interleave
        return subprocess.Popen(["bash", "-c", SHELL_PROLOGUE + attempt.spec["run"]],
                                cwd=attempt.job_dir, env=env, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip


def supervise(attempt: Attempt, output: Output, child) -> int:
    """Follows the running job to its end: its output, the log's uploads, the bytecode
    publisher and (a job that asks for one) the next attempt's standby after its first progress;
    then its exit code in job.exit."""
    spec, contract, venv, reference = (
        attempt.spec,
        attempt.contract,
        attempt.venv,
        attempt.reference,
    )
    stop = threading.Event()
    uploads = threading.Thread(target=shipper, args=(output, stop), daemon=True)
    uploads.start()
    publisher, standby = None, None
    while True:
        try:
            returncode = child.wait(timeout=FOLLOW_S)
            break
        except subprocess.TimeoutExpired:
            output.follow()
            if publisher is None and reference is None and progressed(output):
                publisher = publish_bytecode(spec, contract, venv, attempt.log) or False
                standby = start_standby(spec) or False
    code = exit_code(returncode)
    output.note(f"job exited {code}" + (" after SIGTERM" if attempt.termed.is_set() else ""))
    if publisher:
        publisher.kill()  # not done yet: the next start publishes
        publisher.wait()
    if standby:
        standby.wait()  # jobctl's `standby` only starts it (its own session) and returns
    stop.set()
    try:
        output.ship()
    except (OSError, ValueError) as err:
        output.note(f"last log upload failed: {err}")
    output.close()
    return finish(reference, code)


def finish(reference: str | None, code: int) -> int:
    if reference is None:
        write_atomic(path("job.exit"), f"{code}\n")
    return code


# -- the standby (docs/proposals/standby-interpreter.md; its parked side: jobrun_standby.py) ---
def start_standby(spec: dict):
    """After the job's first progress: `jobctl standby` in a session of its own, for a job that
    asks for one; it parks in a unit of its own or a session of its own (a stop of this job
    leaves it)."""
    if not spec.get("standby"):
        return None
    jobctl = os.path.join(os.path.realpath(path("current")), "bootstrap", "jobctl.sh")
    return subprocess.Popen(["bash", jobctl, "standby"], env={**os.environ, "TPUPOD_ROOT": ROOT},
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["standby"]:
        from bootstrap import jobrun_standby

        sys.exit(jobrun_standby.park(sys.modules[__name__]))
    sys.exit(run(args[1] if args[:1] == ["reference"] and len(args) == 2 else None))
