#!/usr/bin/env bash
# tpupod worker bootstrap: the `startup-script` metadata of every TPU worker.
#
# Runs at every boot (GCE guest agent; the local pod runs it the same way) and is safe to re-run.
# Named phases, each bounded by a deadline, each logged with a timestamp to $TPUPOD_ROOT/bootstrap.log
# and recorded in $TPUPOD_ROOT/bootstrap.json (docs/seams.md), which the ops layer reads.
#   metadata      read tpupod-* keys, worker number and endpoints from the metadata server
#   bundle        fetch the code bundle by sha256 into bundles/<sha>, verified, atomically
#   uv            install a pinned uv if absent (its hash-pinned wheel from the bucket, else from
#                 PyPI); let uv provide Python >= 3.11
#   sync          uv sync --locked for this worker's group, from the bucket's archive of this
#                 environment when one is published (bootstrap/envcache.py), else from the index;
#                 environments live in the VM's memory when it has room (env_home below)
#   job-python    the job's own environment (`python: uv` or `requirements`), the same way, built
#                 once per lock or requirements; `python: none` runs in the bundle's environment
#   clear-stale   stop a job left on older code, clear libtpu locks
#   job-env       write job.json (the spec), job.env (the job contract's variables), job.attempt
#   bytecode      a new venv gets the bytecode the built-in trainer's imports need from the
#                 bucket, if one published it (trainer/bytecode.py); a cache: never fails the boot
#   start-job     jobctl.sh start (systemd unit, or setsid + pidfile); a no-op while it runs
# A failing phase marks bootstrap.json failed with its name and why, and the script exits non-zero.
set -euo pipefail

export TPUPOD_ROOT="${TPUPOD_ROOT:-/var/lib/tpupod}"
# The guest agent may start us without HOME; uv keeps its Python installs under it.
export HOME="${HOME:-/root}"
export GCE_METADATA_HOST="${GCE_METADATA_HOST:-metadata.google.internal}"
export UV_CACHE_DIR="${UV_CACHE_DIR:-/var/cache/uv}"
# Where uv keeps a Python it had to download: on the disk the bootstrap owns, archived to the bucket.
export UV_PYTHON_INSTALL_DIR="${UV_PYTHON_INSTALL_DIR:-$TPUPOD_ROOT/python}"
# Not a knob: the uv pip may install is pinned by version and sha256 in uv_requirements below.
export TPUPOD_UV_VERSION=0.13.9
export TPUPOD_PYTHON="${TPUPOD_PYTHON:-3.11}"
export BOOTSTRAP_JSON="$TPUPOD_ROOT/bootstrap.json"
export BOOTSTRAP_LOG="$TPUPOD_ROOT/bootstrap.log"
# Environments (the bundle's venv, a job's own, the uv caches they are linked from) live in the
# VM's memory, a tmpfs, when it has TPUPOD_RAM_MIN_FREE_MB free and allows executables: a cold
# worker unpacks 0.7-1.2 GB of files into them, the slowest step of a recreate on a disk (~7 s of
# an 8 s sync on the local pod's), ~1 s in memory. Memory empties with the VM, as a recreate's
# new disk starts empty; a restart on the same VM keeps it. Else, and with TPUPOD_ENV_IN_RAM=0,
# they live on the disk under $TPUPOD_ROOT.
export TPUPOD_RAM_DIR="${TPUPOD_RAM_DIR:-/dev/shm/tpupod}"
export TPUPOD_RAM_MIN_FREE_MB="${TPUPOD_RAM_MIN_FREE_MB:-4096}"
# main decides (env_home); the watcher VM, which sources this script's phases and never runs its
# main, keeps its environment on its disk: its service starts from it at boot.
export TPUPOD_ENV_HOME="${TPUPOD_ENV_HOME:-$TPUPOD_ROOT}"
# Per-run scratch: phase outputs and the metadata handed from phase 1 to the others.
export BOOTSTRAP_STATE="$TPUPOD_ROOT/.bootstrap"
# The bundle's own environment is .venv; never one inherited from whoever started us.
unset VIRTUAL_ENV UV_PROJECT_ENVIRONMENT

# ---------------------------------------------------------------------------------------------
# Helpers (exported: each phase runs in a child bash under `timeout`).

# Builtins only (no date, no tee): every line of every phase's output passes through here, and
# two forks a line cost a cold boot about a second (uv lists each package it installs).
log() { # log PHASE MESSAGE...
  local phase=$1 now stamp line
  shift
  now=$EPOCHREALTIME # seconds.microseconds; the separator follows the locale
  TZ=UTC printf -v stamp '%(%Y-%m-%dT%H:%M:%S)T' "${now%[.,]*}"
  now=${now#*[.,]}
  printf -v line '%s.%sZ [%s] %s' "$stamp" "${now:0:3}" "$phase" "$*"
  printf '%s\n' "$line" >>"$BOOTSTRAP_LOG"
  printf '%s\n' "$line"
}

die() { # die MESSAGE: fail the current phase with a reason recorded in bootstrap.json
  printf '%s\n' "$*" >"$BOOTSTRAP_STATE/reason"
  printf 'error: %s\n' "$*" >&2
  exit 1
}

# record EVENT PHASE [MESSAGE]: EVENT is begin|phase-start|phase-ok|phase-failed|finish.
# Twice per phase, on the recovery path: stdlib only, so -I -S (no site, no user or env paths)
# skips the site-packages scan at every start.
record() {
  EVENT=$1 PHASE=$2 MESSAGE=${3:-} python3 -I -S - "$BOOTSTRAP_JSON" <<'PY'
import json, os, sys, time

path, now = sys.argv[1], time.time()
event, phase, message = os.environ["EVENT"], os.environ["PHASE"], os.environ["MESSAGE"]
doc = {}
if event != "begin":
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        doc = {}
doc.setdefault("phases", [])
doc.update(phase=phase, message=message, updated=now,
           bundle_sha256=os.environ.get("MD_BUNDLE_SHA256") or doc.get("bundle_sha256"))
if event == "begin":
    doc.update(state="running", started=now)
elif event == "phase-start":
    doc["state"] = "running"
    doc["phases"].append(dict(name=phase, state="running", started=now, ended=None, seconds=None,
                              message=""))
elif event in ("phase-ok", "phase-failed"):
    entry = doc["phases"][-1]
    entry.update(state="ok" if event == "phase-ok" else "failed", ended=now,
                 seconds=round(now - entry["started"], 3), message=message)
    if event == "phase-failed":
        doc["state"] = "failed"
elif event == "finish":
    doc["state"] = "ok"
tmp = f"{path}.{os.getpid()}.tmp"
with open(tmp, "w") as f:
    json.dump(doc, f, indent=1)
os.replace(tmp, path)
PY
}

# md PATH: GET a metadata path (relative to computeMetadata/v1/). Exit 4 when the server says the
# key does not exist; retries while the server is unreachable (early boot), within the deadline.
# The body goes through a 0600 file of its own (mktemp): the token is one of these bodies.
md() {
  local url="http://$GCE_METADATA_HOST/computeMetadata/v1/$1" code body
  while true; do
    body=$(mktemp "$BOOTSTRAP_STATE/md.XXXXXX")
    code=$(curl --silent --noproxy '*' --max-time 10 -H 'Metadata-Flavor: Google' \
      -o "$body" -w '%{http_code}' "$url") || code=000
    case "$code" in
    200)
      cat "$body"
      rm -f "$body"
      return 0
      ;;
    404)
      rm -f "$body"
      return 4
      ;;
    esac
    rm -f "$body"
    echo "metadata server at $GCE_METADATA_HOST answered $code for $1; retrying" >&2
    sleep 2
  done
}

attr() { md "instance/attributes/$1"; }

# ---------------------------------------------------------------------------------------------
# Phases

phase_metadata() {
  local out="$BOOTSTRAP_STATE/metadata.sh" key var value
  : >"$out.tmp"
  # var:key:required
  # The worker's index: agent-worker-number (Cloud TPU API), else worker-id (Compute Engine).
  for spec in MD_WORKER:agent-worker-number:0 MD_WORKER_ID:worker-id:0 \
    MD_ENDPOINTS:worker-network-endpoints:1 \
    MD_BUCKET:tpupod-bucket:1 MD_BUNDLE_OBJECT:tpupod-bundle-object:1 \
    MD_BUNDLE_SHA256:tpupod-bundle-sha256:1 MD_STACK:tpupod-stack:1 \
    MD_JOB:tpupod-job:1 MD_RUN_ID:tpupod-run-id:1 MD_RUN_DIR:tpupod-run-dir:1 \
    MD_ATTEMPT:tpupod-attempt:0 MD_COMPILE_CACHE:tpupod-compile-cache:0 \
    MD_UV_GROUP:tpupod-uv-group:0 MD_COORDINATOR_PORT:tpupod-coordinator-port:0; do
    IFS=: read -r var key required <<<"$spec"
    if value=$(attr "$key"); then
      [ -n "$value" ] || [ "$required" = 0 ] || die "metadata key $key is empty"
    elif [ "$required" = 1 ]; then
      die "metadata key $key is missing"
    else
      value=""
    fi
    printf 'export %s=%q\n' "$var" "$value" >>"$out.tmp"
  done
  mv "$out.tmp" "$out"
  # shellcheck source=/dev/null
  . "$out"
  MD_WORKER=${MD_WORKER:-$MD_WORKER_ID}
  [ -n "$MD_WORKER" ] || die "metadata keys agent-worker-number and worker-id are both missing"
  printf 'export MD_WORKER=%q\n' "$MD_WORKER" >>"$out"
  [[ "$MD_WORKER" =~ ^[0-9]+$ ]] || die "the worker's index is not a number: $MD_WORKER"
  [[ "$MD_BUNDLE_SHA256" =~ ^[0-9a-f]{64}$ ]] || die "tpupod-bundle-sha256 is not a sha256: $MD_BUNDLE_SHA256"
  [[ "$MD_ATTEMPT" =~ ^[0-9]*$ ]] || die "tpupod-attempt is not a number: $MD_ATTEMPT"
  echo "worker $MD_WORKER of stack $MD_STACK, run $MD_RUN_ID, bundle $MD_BUNDLE_SHA256"
}

# True when uv's version ($1) is at least the pinned one.
uv_recent_enough() {
  [ "$(printf '%s\n%s\n' "$TPUPOD_UV_VERSION" "$1" | sort -V | sed -n 1p)" = "$TPUPOD_UV_VERSION" ]
}

# uv's wheels on PyPI for the Linux platforms TPU VMs run (manylinux x86_64; aarch64 manylinux
# 2.17 and 2.28; musllinux for both), by sha256 as PyPI publishes them: pip installs no other
# bytes. Update version and hashes together, here and in .github/uv-requirements.txt (CI uses
# that copy; tests/test_workflows.py checks that the two agree).
uv_requirements() {
  cat <<'REQUIREMENTS'
uv==0.13.9 \
    --hash=sha256:d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19 \
    --hash=sha256:5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe \
    --hash=sha256:ecb6028d79dc96fbeafffe5c8af62a7099487ebc05a701e76714eebcffd06375 \
    --hash=sha256:2c45530751517d6c3bbc69a19473f6effe47cce047bede01ffd8af7ea7b36b25
REQUIREMENTS
}

# install_uv DIR: the pinned uv wheel's binaries into DIR/bin, or fail the phase naming what is
# missing. The wheel comes from the bucket when a worker published it, else from PyPI through pip
# (then published); either way its sha256 must be one pinned above. Never a downloaded installer
# script: nothing here runs unverified code.
install_uv() {
  local dir=$1 req="$BOOTSTRAP_STATE/uv-requirements.txt" out="$BOOTSTRAP_STATE/pip.out" rc=0
  local fix="or put uv >= $TPUPOD_UV_VERSION on PATH" wheels key found=0 wheel got
  wheels="$TPUPOD_ROOT/tools/uv-wheels-$TPUPOD_UV_VERSION"
  key="uv-$TPUPOD_UV_VERSION-$(uname -m)"
  command -v python3 >/dev/null ||
    die "cannot install uv: no python3 on PATH (install python3 and python3-pip, $fix)"
  uv_requirements >"$req"
  rm -rf "$dir" "$dir.tmp"
  [ -f "$wheels/.tpupod-complete" ] || envcache restore "$key" "$wheels" || found=$?
  if [ "$found" -ne 0 ]; then
    rm -rf "$wheels"
    python3 -m pip --version >/dev/null 2>&1 ||
      die "cannot install uv: python3 has no pip (apt-get install -y python3-pip, $fix)"
    PIP_ROOT_USER_ACTION=ignore python3 -m pip download --quiet --disable-pip-version-check \
      --require-hashes --no-deps --only-binary :all: -d "$wheels" -r "$req" >"$out" 2>&1 || rc=$?
    cat "$out"
    if [ "$rc" -ne 0 ]; then
      rm -rf "$wheels"
      if grep -q 'DO NOT MATCH THE HASHES' "$out"; then
        die "refusing uv $TPUPOD_UV_VERSION: the wheel pip was served matches no sha256 pinned in startup.sh (a tampered index or mirror?)"
      fi
      die "cannot install uv $TPUPOD_UV_VERSION from its hash-pinned wheel (pip exit $rc): make ${PIP_INDEX_URL:-PyPI} reachable, $fix"
    fi
    touch "$wheels/.tpupod-complete"
    publish_env "$key" "$wheels" "$found"
  fi
  wheel=$(find "$wheels" -maxdepth 1 -name "uv-$TPUPOD_UV_VERSION-*.whl" | head -n 1)
  got=$(sha256sum "${wheel:-/dev/null}" | cut -d' ' -f1)
  if [ -z "$wheel" ] || ! grep -q -- "--hash=sha256:$got" "$req"; then
    rm -rf "$wheels"
    die "refusing uv $TPUPOD_UV_VERSION: the wheel from gs://$MD_BUCKET matches no sha256 pinned in startup.sh"
  fi
  # A wheel is a zip; uv's carries its binaries under uv-VERSION.data/scripts/.
  python3 -I -S - "$wheel" "$dir.tmp/bin" <<'PY'
import os, sys, zipfile

wheel, bin_dir = sys.argv[1], sys.argv[2]
os.makedirs(bin_dir)
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        head, _, base = name.rpartition("/")
        if head.endswith(".data/scripts") and base:
            with z.open(name) as src, open(os.path.join(bin_dir, base), "wb") as dst:
                dst.write(src.read())
            os.chmod(os.path.join(bin_dir, base), 0o755)
PY
  mv -T "$dir.tmp" "$dir"
}

# envcache VERB ARGS...: bootstrap/envcache.py of this bundle (stdlib only).
envcache() {
  python3 -I -S "$TPUPOD_ROOT/bundles/$MD_BUNDLE_SHA256/bootstrap/envcache.py" "$@"
}

# publish_env KEY DIR FOUND: worker 0 publishes DIR for every later boot (FOUND, the restore's
# exit: 4 means the bucket's copy was refused, so it is replaced). Never fails the boot.
publish_env() {
  [ "$MD_WORKER" = 0 ] || return 0
  local replace=()
  [ "$3" != 4 ] || replace=(--replace)
  envcache publish "$1" "$2" "${replace[@]}" ||
    echo "warning: environment $1 not published (exit $?): the next boot builds it again"
}

# env_from_bucket KEY COMMAND...: run COMMAND (a uv install) with a uv cache of this environment's
# own: restored from the bucket and used offline when a worker published one, else filled from
# the package index and published. A refused or incomplete archive is built again, in one line.
env_from_bucket() {
  local key=$1 cache="$TPUPOD_ENV_HOME/uv/env-$1" found=0
  shift
  echo "$key" >>"$BOOTSTRAP_STATE/env-keys"
  if [ ! -f "$cache/.tpupod-complete" ]; then
    envcache restore "$key" "$cache" || found=$?
  fi
  if [ "$found" -eq 0 ]; then
    if UV_CACHE_DIR="$cache" UV_OFFLINE=1 "$@"; then
      return 0
    fi
    echo "environment $key did not install offline from its archive: building it from the package index"
    found=4
  fi
  rm -rf "$cache"
  mkdir -p "$cache"
  UV_CACHE_DIR="$cache" "$@"
  touch "$cache/.tpupod-complete"
  publish_env "$key" "$cache" "$found"
}

phase_uv() {
  local have=""
  if command -v uv >/dev/null; then
    have=$(uv --version | awk '{print $2}')
  fi
  if [ -n "$have" ] && uv_recent_enough "$have"; then
    echo "uv $have present at $(command -v uv)"
  else
    # $TPUPOD_ROOT/bin leads PATH (main).
    local dir="$TPUPOD_ROOT/tools/uv-$TPUPOD_UV_VERSION"
    echo "installing uv $TPUPOD_UV_VERSION (found: ${have:-none})"
    mkdir -p "$TPUPOD_ROOT/bin"
    "$dir/bin/uv" --version >/dev/null 2>&1 || install_uv "$dir"
    ln -sfn "$dir/bin/uv" "$TPUPOD_ROOT/bin/uv"
    echo "uv $(uv --version | awk '{print $2}') installed at $(command -v uv)"
  fi
  # TPU images ship Python 3.10; uv finds a recent enough one, or the one a worker published to
  # the bucket, or downloads a managed one from GitHub (uv checks each download against the
  # sha256 it carries for it) and worker 0 publishes it.
  if ! uv python find "$TPUPOD_PYTHON" >/dev/null 2>&1; then
    local key found=0
    key="python-$TPUPOD_PYTHON-$(uname -m)-uv$TPUPOD_UV_VERSION"
    envcache restore "$key" "$UV_PYTHON_INSTALL_DIR" || found=$?
    if [ "$found" -ne 0 ] || ! uv python find "$TPUPOD_PYTHON" >/dev/null 2>&1; then
      uv python install "$TPUPOD_PYTHON"
      publish_env "$key" "$UV_PYTHON_INSTALL_DIR" "$found"
    fi
  fi
  echo "python $TPUPOD_PYTHON at $(uv python find "$TPUPOD_PYTHON")"
}

phase_bundle() {
  local dest="$TPUPOD_ROOT/bundles/$MD_BUNDLE_SHA256" tmp token object url got
  if [ -f "$dest/.tpupod-bundle" ]; then
    echo "bundle $MD_BUNDLE_SHA256 already present"
    return 0
  fi
  mkdir -p "$TPUPOD_ROOT/bundles"
  # Leftovers of a fetch killed at its deadline (we hold the bootstrap lock: none is running).
  rm -rf "$TPUPOD_ROOT"/bundles/.fetch.*
  tmp=$(mktemp -d "$TPUPOD_ROOT/bundles/.fetch.XXXXXX")
  # shellcheck disable=SC2064 # expand now: tmp is local
  trap "rm -rf '$tmp'" EXIT
  token=$(md instance/service-accounts/default/token |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["access_token"])') ||
    die "no access token from the metadata server"
  object=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' \
    "$MD_BUNDLE_OBJECT")
  url="${STORAGE_EMULATOR_HOST:-https://storage.googleapis.com}/storage/v1/b/$MD_BUCKET/o/$object?alt=media"
  echo "fetching gs://$MD_BUCKET/$MD_BUNDLE_OBJECT"
  # The header comes on stdin (`-H @-`, curl >= 7.55), from printf, a builtin: the token is in
  # no process's argv (/proc/*/cmdline is world-readable).
  printf 'Authorization: Bearer %s\n' "$token" |
    curl --silent --show-error --fail --location --retry 5 --retry-all-errors --max-time 600 \
      -H @- -o "$tmp/bundle.tar.gz" "$url" ||
    die "download of gs://$MD_BUCKET/$MD_BUNDLE_OBJECT failed"
  got=$(sha256sum "$tmp/bundle.tar.gz" | cut -d' ' -f1)
  [ "$got" = "$MD_BUNDLE_SHA256" ] || die "bundle sha256 mismatch: expected $MD_BUNDLE_SHA256, got $got"
  mkdir "$tmp/tree"
  tar -xzf "$tmp/bundle.tar.gz" -C "$tmp/tree" --no-same-owner
  echo "$MD_BUNDLE_SHA256" >"$tmp/tree/.tpupod-bundle"
  # rename(2) is atomic: a bundle directory is complete or absent.
  mv -T "$tmp/tree" "$dest"
  echo "bundle extracted to $dest"
}

# env_home: where this boot keeps environments (see TPUPOD_RAM_DIR above), decided once a boot.
# /dev/shm is writable by every user: a directory there that is a link, or that is not ours alone
# to write, could have been planted to swap the job's code; the disk is used instead.
env_home() {
  local avail options
  # shellcheck disable=SC2174 # the mode is for the directory itself; /dev/shm's is the system's
  if [ "${TPUPOD_ENV_IN_RAM:-1}" != 0 ] && [ ! -L "$TPUPOD_RAM_DIR" ] &&
    mkdir -p -m 0755 "$TPUPOD_RAM_DIR" 2>/dev/null && ours_alone "$TPUPOD_RAM_DIR" &&
    options=$(findmnt -no OPTIONS --target "$TPUPOD_RAM_DIR" 2>/dev/null) &&
    [[ ",$options," != *,noexec,* ]] &&
    avail=$(df -Pk "$TPUPOD_RAM_DIR" | awk 'NR == 2 { print int($4 / 1024) }') &&
    [ "$avail" -ge "$TPUPOD_RAM_MIN_FREE_MB" ]; then
    echo "$TPUPOD_RAM_DIR"
  else
    echo "$TPUPOD_ROOT"
  fi
}

# ours_alone DIR: a directory (not a link) this user owns and no other user may write to.
ours_alone() {
  [ -d "$1" ] && [ ! -L "$1" ] && [ -O "$1" ] &&
    [ -z "$(find "$1" -maxdepth 0 -perm /022 2>/dev/null)" ]
}

phase_sync() {
  local dir="$TPUPOD_ROOT/bundles/$MD_BUNDLE_SHA256" key venv
  local args=(sync --locked --no-install-project --no-default-groups)
  [ -z "$MD_UV_GROUP" ] || args+=(--group "$MD_UV_GROUP")
  # The venv lives with the environments and the bundle links to it (.venv: what jobctl runs).
  venv="$TPUPOD_ENV_HOME/venvs/$MD_BUNDLE_SHA256"
  if [ -d "$dir/.venv" ] && [ ! -L "$dir/.venv" ]; then venv="$dir/.venv"; fi
  mkdir -p "$UV_CACHE_DIR" "$TPUPOD_ENV_HOME/uv" "$TPUPOD_ENV_HOME/venvs"
  cd "$dir"
  key=$(envcache key "bundle:$MD_UV_GROUP" --python "$(uv python find)" pyproject.toml uv.lock)
  echo "uv ${args[*]} in $dir (environment $key, in $TPUPOD_ENV_HOME)"
  UV_PROJECT_ENVIRONMENT="$venv" env_from_bucket "$key" uv "${args[@]}"
  echo "$key" >"$venv/.tpupod-env-key" # its uv cache is kept while it is (prune_environments)
  [ "$venv" = "$dir/.venv" ] || ln -sfn "$venv" "$dir/.venv"
  echo "environment ready: $dir/.venv"
}

# job_field NAME: one field of the job's spec (the tpupod-job metadata, JSON) as text.
job_field() {
  python3 -I -S -c 'import json, os, sys; v = json.loads(os.environ["MD_JOB"]).get(sys.argv[1])
print("" if v is None else v)' "$1"
}

phase_job_python() {
  local dir="$TPUPOD_ROOT/bundles/$MD_BUNDLE_SHA256" mode hash env key
  mode=$(job_field python)
  case "$mode" in
  none)
    echo "$dir/.venv" >"$TPUPOD_ROOT/job.venv"
    echo "python: none: the job runs in the bundle's environment ($dir/.venv)"
    return 0
    ;;
  uv) hash=$(cat "$dir/job/pyproject.toml" "$dir/job/uv.lock" | sha256sum | cut -c1-16) ;;
  requirements) hash=$(sha256sum <"$dir/job/requirements.txt" | cut -c1-16) ;;
  *) die "tpupod-job: unknown python mode ${mode:-(none given)}" ;;
  esac
  env="$TPUPOD_ENV_HOME/envs/$mode-$hash"
  if [ -f "$env/.tpupod-env" ]; then
    echo "python: $mode environment $env already built"
  else
    # Built in place (a venv's scripts name its path: one built elsewhere and moved breaks
    # them); the marker, written last, is what says it is complete. Its packages come from the
    # bucket's archive of this environment once a worker published one.
    rm -rf "$env"
    mkdir -p "$TPUPOD_ENV_HOME/envs" "$UV_CACHE_DIR"
    cd "$dir/job"
    if [ "$mode" = uv ]; then # the job's own lock; the project itself runs from job/
      key=$(envcache key job:uv --python "$(uv python find)" pyproject.toml uv.lock)
      UV_PROJECT_ENVIRONMENT="$env" env_from_bucket "$key" uv sync --locked --no-install-project
    else
      key=$(envcache key job:requirements --python "$(uv python find)" requirements.txt)
      uv venv --quiet "$env"
      env_from_bucket "$key" uv pip install --python "$env/bin/python" -r requirements.txt
    fi
    echo "$hash" >"$env/.tpupod-env"
    echo "python: $mode environment built in $env"
  fi
  echo "$env" >"$TPUPOD_ROOT/job.venv"
}

phase_clear_stale() {
  local ctl="$TPUPOD_ROOT/bundles/$MD_BUNDLE_SHA256/bootstrap/jobctl.sh" running
  if running=$("$ctl" bundle); then
    if [ "$running" = "$MD_BUNDLE_SHA256" ]; then
      echo "the job on this bundle is running: leaving it"
      return 0
    fi
    echo "job runs bundle ${running:-?}, want $MD_BUNDLE_SHA256: stopping it"
    "$ctl" stop
  fi
  "$ctl" clear-locks
  # Old bundles and their venvs go; the newest few stay for a quick rollback.
  local dir kept=0
  while IFS= read -r dir; do
    [ "${dir##*/}" != "$MD_BUNDLE_SHA256" ] || continue
    kept=$((kept + 1))
    if [ "$kept" -gt 2 ]; then
      # its venv, linked from venvs/ (phase_sync), goes in prune_environments: no kept bundle
      # links to it then; whatever else a link might name is never followed (this runs as root)
      echo "removing old bundle ${dir##*/}"
      rm -rf "$dir"
    fi
  done < <(find "$TPUPOD_ROOT/bundles" -mindepth 1 -maxdepth 1 -type d -name '[0-9a-f]*' \
    -printf '%T@ %p\n' | sort -rn | cut -d' ' -f2-)
  prune_environments
  echo "no job running, locks clear"
}

# prune_environments: what no kept environment needs goes (in memory it holds RAM until a
# reboot), in both places a boot of this VM may have put environments (the other one: memory was
# full, or has room again): job environments but the one this boot chose (job.venv), venvs no
# kept bundle links to, the uv caches no kept environment there was installed from (the venvs
# hold hard links into them: their files stay), and restores a phase deadline cut short.
prune_environments() {
  local home homes=("$TPUPOD_ENV_HOME") other env venv cache keep="$BOOTSTRAP_STATE/env-keys-kept"
  local chosen
  other=$(other_env_home)
  [ -z "$other" ] || homes+=("$other")
  chosen=$(cat "$TPUPOD_ROOT/job.venv" 2>/dev/null || true)
  for home in "${homes[@]}"; do
    kept_env_keys "$home" >"$keep"
    for env in "$home"/envs/*; do
      if [ -d "$env" ] && [ "$env" != "$chosen" ]; then
        echo "removing job environment ${env##*/} from $home (not this boot's)"
        rm -rf "$env"
      fi
    done
    for venv in "$home"/venvs/*; do
      if [ -d "$venv" ] && ! linked_from_a_bundle "$venv"; then
        echo "removing venv ${venv##*/} from $home (no kept bundle's)"
        rm -rf "$venv"
      fi
    done
    for cache in "$home"/uv/env-*; do
      if [ -d "$cache" ] && ! grep -qxF -- "${cache##*/env-}" "$keep"; then
        echo "removing the uv cache of environment ${cache##*/env-} from $home (no kept environment's)"
        rm -rf "$cache"
      fi
    done
    rm -rf "$home"/uv/.envcache.*
  done
}

# linked_from_a_bundle DIR: a kept bundle's .venv link resolves to DIR (the same directory,
# however either is spelled).
linked_from_a_bundle() {
  local link
  for link in "$TPUPOD_ROOT"/bundles/*/.venv; do
    if [ -L "$link" ] && [ "$link" -ef "$1" ]; then return 0; fi
  done
  return 1
}

# kept_env_keys HOME: the environment keys whose uv caches in HOME stay: this boot's (in its own
# home) and those of the kept bundles' venvs that live in HOME (a venv is hard-linked from the
# cache beside it). A venv inside its bundle (the layout before venvs/) keeps its key in both.
kept_env_keys() {
  local link venv
  if [ "$1" = "$TPUPOD_ENV_HOME" ]; then cat "$BOOTSTRAP_STATE/env-keys" 2>/dev/null || true; fi
  for link in "$TPUPOD_ROOT"/bundles/*/.venv; do
    if [ -L "$link" ]; then
      venv=$(readlink -f "$link") || continue
      [ "${venv%/venvs/*}" -ef "$1" ] || continue
    fi
    cat "$link/.tpupod-env-key" 2>/dev/null || true
  done
}

# other_env_home: the place this boot did not choose (env_home), where an earlier boot of this
# VM may have left environments; memory only when it is a directory of ours alone (env_home's
# conditions on who may write it: never follow what someone else could have planted there).
other_env_home() {
  if [ "$TPUPOD_ENV_HOME" != "$TPUPOD_ROOT" ]; then
    echo "$TPUPOD_ROOT"
  elif ours_alone "$TPUPOD_RAM_DIR"; then
    echo "$TPUPOD_RAM_DIR"
  fi
}

phase_job_env() {
  local env="$TPUPOD_ROOT/job.env" coordinator_ip count grace max_loss attempt=1
  coordinator_ip=$(cut -d, -f1 <<<"$MD_ENDPOINTS" | awk -F: '{print $NF}')
  count=$(tr ',' '\n' <<<"$MD_ENDPOINTS" | grep -c .)
  [ -n "$coordinator_ip" ] || die "worker-network-endpoints has no address: $MD_ENDPOINTS"
  grace=$(job_field grace_s)
  max_loss=$(job_field max_loss_minutes)
  # The job contract (README, "Bring your own program"): the same names on GCP and the local pod.
  {
    echo "TPUPOD_RUN_ID=$MD_RUN_ID"
    echo "TPUPOD_PROCESS_ID=$MD_WORKER"
    echo "TPUPOD_NUM_PROCESSES=$count"
    echo "JAX_COORDINATOR_ADDRESS=$coordinator_ip:${MD_COORDINATOR_PORT:-8482}"
    echo "TPUPOD_RUN_DIR=$MD_RUN_DIR"
    echo "TPUPOD_CHECKPOINT_DIR=$MD_RUN_DIR/checkpoints"
    echo "TPUPOD_STATUS_FILE=$TPUPOD_ROOT/status.json"
    # The local tier: this VM's own disk (a recreated VM starts empty; the local pod wipes it).
    echo "TPUPOD_LOCAL_CHECKPOINT_DIR=$TPUPOD_ROOT/local-checkpoints/$MD_RUN_ID"
    echo "TPUPOD_GRACE_S=$grace"
    echo "TPUPOD_MAX_LOSS_S=$(awk -v m="${max_loss:-5}" \
      'BEGIN { s = int(m * 60 + 0.999); if (s < 1) s = 1; printf "%d", s }')"
    echo "TPUPOD_COMPILE_CACHE=${MD_COMPILE_CACHE:-off}"
    echo "GCE_METADATA_HOST=$GCE_METADATA_HOST"
    # Storage emulator access (local pod) travels through the standard variables only.
    # So is the local pod's CPU device layout; none of these is set on GCP.
    for var in STORAGE_EMULATOR_HOST TENSORSTORE_GCS_HTTP_URL \
      GOOGLE_AUTH_TOKEN_FOR_TESTING FSSPEC_GCS_TOKEN NO_GCE_CHECK \
      GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT JAX_PLATFORMS XLA_FLAGS TPUPOD_INIT_TIMEOUT \
      TPUPOD_SECRETMANAGER_ENDPOINT; do
      if [ -n "${!var:-}" ]; then echo "$var=${!var}"; fi
    done
  } >"$env.tmp"
  printf '%s\n' "$MD_JOB" >"$TPUPOD_ROOT/job.json.tmp"
  if [ -f "$env" ] && ! { cmp -s "$env" "$env.tmp" && cmp -s "$TPUPOD_ROOT/job.json" \
    "$TPUPOD_ROOT/job.json.tmp"; } && "$TPUPOD_ROOT/current/bootstrap/jobctl.sh" status >/dev/null 2>&1; then
    echo "job environment changed: stopping the job started with the old one"
    "$TPUPOD_ROOT/current/bootstrap/jobctl.sh" stop
    "$TPUPOD_ROOT/current/bootstrap/jobctl.sh" clear-locks
  fi
  mv "$env.tmp" "$env"
  mv "$TPUPOD_ROOT/job.json.tmp" "$TPUPOD_ROOT/job.json"
  # The attempt a recovery created this node for; never lower than the one this disk ran.
  [ -z "$MD_ATTEMPT" ] || attempt=$MD_ATTEMPT
  if [ -f "$TPUPOD_ROOT/job.attempt" ] && [ "$(cat "$TPUPOD_ROOT/job.attempt")" -gt "$attempt" ]; then
    attempt=$(cat "$TPUPOD_ROOT/job.attempt")
  fi
  echo "$attempt" >"$TPUPOD_ROOT/job.attempt"
  cat "$env"
  echo "wrote $env (attempt $attempt)"
}

phase_bytecode() {
  local dir="$TPUPOD_ROOT/bundles/$MD_BUNDLE_SHA256"
  if [ -z "$MD_COMPILE_CACHE" ] || [ "$MD_COMPILE_CACHE" = off ]; then
    echo "no compile cache in metadata: no bytecode to restore"
    return 0
  fi
  # -I -S: stdlib only, like record(); the venv's interpreter, whose bytecode this is. Bounded
  # inside the phase's deadline: a slow or failed restore costs only the compiles it would save.
  timeout -k 2 $((TPUPOD_PHASE_DEADLINE * 2 / 3 + 1)) "$dir/.venv/bin/python" -I -S \
    "$dir/trainer/bytecode.py" restore "$MD_COMPILE_CACHE" --venv "$dir/.venv" ||
    echo "warning: no bytecode restored (exit $?): the job's first imports compile from source"
}

# bytecode_beside: phase_bytecode in the background, right after sync (it needs only the synced
# venv), its output and exit status to files: a cold worker's restore (a second or two of
# unpacking) runs beside job-python, clear-stale and job-env; the bytecode phase waits for it.
bytecode_beside() {
  rm -f "$BOOTSTRAP_STATE/bytecode-beside.out" "$BOOTSTRAP_STATE/bytecode-beside.rc"
  {
    local rc=0
    TPUPOD_PHASE_DEADLINE=30 phase_bytecode >"$BOOTSTRAP_STATE/bytecode-beside.out" 2>&1 || rc=$?
    echo "$rc" >"$BOOTSTRAP_STATE/bytecode-beside.rc"
  } 9>&- &
}

phase_bytecode_wait() {
  while [ ! -s "$BOOTSTRAP_STATE/bytecode-beside.rc" ]; do sleep 0.05; done
  cat "$BOOTSTRAP_STATE/bytecode-beside.out"
  return "$(cat "$BOOTSTRAP_STATE/bytecode-beside.rc")"
}

phase_start_job() {
  # Exit 3: the job ran and exited at once. The slice is fine and the launch is done; the
  # watcher judges job.exit as the job's failure (a restart, not a re-created slice).
  local rc=0
  "$TPUPOD_ROOT/current/bootstrap/jobctl.sh" start || rc=$?
  [ "$rc" -ne 3 ] || return 0
  return "$rc"
}

export -f log die record md attr uv_recent_enough uv_requirements install_uv envcache \
  publish_env env_from_bucket ours_alone prune_environments linked_from_a_bundle kept_env_keys \
  other_env_home phase_metadata phase_uv phase_bundle phase_sync job_field phase_job_python \
  phase_clear_stale phase_job_env phase_bytecode phase_bytecode_wait phase_start_job

# ---------------------------------------------------------------------------------------------
# The phase runner

# phase NAME DEADLINE_S FUNCTION: run FUNCTION in a child bash under `timeout`, its output
# timestamped into bootstrap.log; record the outcome in bootstrap.json; exit non-zero on failure.
phase() {
  local name=$1 deadline=$2 fn=$3 rc reason override
  # TPUPOD_DEADLINE_<PHASE> (e.g. TPUPOD_DEADLINE_CLEAR_STALE) overrides a deadline.
  override="TPUPOD_DEADLINE_$(tr 'a-z-' 'A-Z_' <<<"$name")"
  deadline=${!override:-$deadline}
  rm -f "$BOOTSTRAP_STATE/reason"
  record phase-start "$name"
  log "$name" "begin (deadline ${deadline}s)"
  set +e
  TPUPOD_PHASE_DEADLINE=$deadline timeout --kill-after=10 "$deadline" \
    bash -c 'set -euo pipefail; "$@"' "$name" "$fn" 2>&1 |
    while IFS= read -r line; do log "$name" "$line"; done |
    tee "$BOOTSTRAP_STATE/$name.out"
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" -eq 0 ]; then
    record phase-ok "$name" "$(tail -n 1 "$BOOTSTRAP_STATE/$name.out" | cut -d' ' -f3-)"
    log "$name" "ok"
    return 0
  fi
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    reason="deadline of ${deadline}s exceeded"
  elif [ -s "$BOOTSTRAP_STATE/reason" ]; then
    reason=$(cat "$BOOTSTRAP_STATE/reason")
  else
    # The first error line names the cause better than the last line (often a hint).
    # (grep reads the file itself: an early exit inside a pipe would fail it under pipefail.)
    reason=$(grep -i -m 1 'error' "$BOOTSTRAP_STATE/$name.out" | cut -d' ' -f3- ||
      tail -n 1 "$BOOTSTRAP_STATE/$name.out" | cut -d' ' -f3-)
    reason="exit $rc: $reason"
  fi
  record phase-failed "$name" "$reason"
  log "$name" "FAILED: $reason"
  exit 1
}

main() {
  mkdir -p "$TPUPOD_ROOT" "$BOOTSTRAP_STATE"
  # Scratch may hold metadata bodies (the access token among them): ours alone.
  chmod 0700 "$BOOTSTRAP_STATE"
  # Never inside some project directory: uv would find it.
  cd "$TPUPOD_ROOT"
  # One bootstrap at a time per worker (fd 9 is closed for the job in start-job).
  exec 9>"$BOOTSTRAP_STATE/lock"
  if ! flock -n 9; then
    log start "another bootstrap is running; waiting for it"
    flock 9
  fi
  rm -f "$BOOTSTRAP_STATE"/md.* # a body left by a run killed mid-request
  record begin start
  log start "bootstrap of $TPUPOD_ROOT (metadata at $GCE_METADATA_HOST)"

  phase metadata 120 phase_metadata
  # shellcheck source=/dev/null
  . "$BOOTSTRAP_STATE/metadata.sh"
  export PATH="$TPUPOD_ROOT/bin:$PATH"

  rm -f "$BOOTSTRAP_STATE/env-keys"
  TPUPOD_ENV_HOME=$(env_home)
  export TPUPOD_ENV_HOME
  log start "environments in $TPUPOD_ENV_HOME"
  phase bundle 600 phase_bundle
  phase uv 300 phase_uv
  phase sync 1800 phase_sync
  bytecode_beside
  phase job-python 1800 phase_job_python
  # The bundle is complete and synced: make it the active one.
  ln -sfn "bundles/$MD_BUNDLE_SHA256" "$TPUPOD_ROOT/current.tmp"
  mv -T "$TPUPOD_ROOT/current.tmp" "$TPUPOD_ROOT/current"
  # Both may stop a job: longer than its grace (jobctl's stop timeout).
  local stop_deadline
  stop_deadline=$((${TPUPOD_STOP_TIMEOUT:-$(job_field grace_s)} + 60))
  phase clear-stale "$stop_deadline" phase_clear_stale
  phase job-env "$stop_deadline" phase_job_env
  phase bytecode 30 phase_bytecode_wait
  phase start-job 60 phase_start_job 9>&-
  record finish start-job "bootstrap complete"
  log finish "bootstrap complete"
}

main "$@"
