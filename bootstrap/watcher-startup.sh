#!/usr/bin/env bash
# tpupod watcher bootstrap: the `startup-script` metadata of the stack's watcher VM (infra/watcher_vm.py).
#
# Runs at every boot and is safe to re-run. It reuses the worker bootstrap itself, not a copy: the
# workers' startup script travels in this VM's metadata inside the node spec (`tpupod-node-spec`,
# which the watcher recreates nodes from), and its helpers and phases are sourced from there:
#   metadata  the node spec, the bundle's bucket/object/sha256 (the spec's own metadata), the stack
#   uv        uv from its hash-pinned wheel (pip --require-hashes; never a downloaded installer)
#   bundle    the code bundle by sha256, verified (the token goes to curl on stdin, never argv)
#   sync      uv sync --locked for the `ops` group (google-cloud-tpu, google-cloud-storage, Fabric)
#   service   tpupod-watcher.service (Restart=always) running `tpupod watch --stack S --spec F`;
#             without systemd (the local pod's VM) the same loop as a detached supervisor
set -euo pipefail

export TPUPOD_ROOT="${TPUPOD_ROOT:-/var/lib/tpupod-watcher}"
export HOME="${HOME:-/root}"
export GCE_METADATA_HOST="${GCE_METADATA_HOST:-metadata.google.internal}"
STATE="$TPUPOD_ROOT/.bootstrap"
mkdir -p "$STATE"
chmod 0700 "$STATE"

meta() { # meta KEY: one instance attribute (fails on anything but 200)
  curl --silent --fail --noproxy '*' --max-time 10 --retry 30 --retry-delay 2 --retry-all-errors \
    -H 'Metadata-Flavor: Google' "http://$GCE_METADATA_HOST/computeMetadata/v1/instance/attributes/$1"
}

meta tpupod-node-spec >"$STATE/node-spec.json.tmp"
mv "$STATE/node-spec.json.tmp" "$TPUPOD_ROOT/node-spec.json"
# The slice's metadata, from either spec: a TPU API node's, or a Compute Engine template's items.
python3 - "$TPUPOD_ROOT/node-spec.json" >"$TPUPOD_ROOT/slice-metadata.json" <<'PY'
import json, sys
spec = json.load(open(sys.argv[1]))
if "node" in spec:
    md = spec["node"]["metadata"]
else:
    md = {i["key"]: i.get("value", "") for i in spec["template"]["properties"]["metadata"]["items"]}
json.dump(md, sys.stdout)
PY
# The workers' startup script, from the spec (the local pod's VM: its checkout's, as the pod's
# workers may boot a test's stand-in); its last line runs its main, which we do not want.
if [ -n "${TPUPOD_WATCHER_CODE:-}" ]; then
  cp "$TPUPOD_WATCHER_CODE/bootstrap/startup.sh" "$STATE/worker-startup.sh"
else
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["startup-script"], end="")' \
    "$TPUPOD_ROOT/slice-metadata.json" >"$STATE/worker-startup.sh"
fi
if [ "$(tail -n 1 "$STATE/worker-startup.sh")" != 'main "$@"' ]; then
  echo "watcher bootstrap: the workers' startup script no longer ends in main \"\$@\"" >&2
  exit 1
fi
# shellcheck source=/dev/null
. <(sed '$d' "$STATE/worker-startup.sh")

phase_metadata() { # the watcher's own: no worker number or endpoints
  local out="$BOOTSTRAP_STATE/metadata.sh"
  python3 - "$TPUPOD_ROOT/slice-metadata.json" "$(attr tpupod-stack)" >"$out.tmp" <<'PY'
import json, shlex, sys
md = json.load(open(sys.argv[1]))
values = {"MD_BUCKET": md["tpupod-bucket"], "MD_BUNDLE_OBJECT": md["tpupod-bundle-object"],
          "MD_BUNDLE_SHA256": md["tpupod-bundle-sha256"], "MD_STACK": sys.argv[2],
          "MD_UV_GROUP": "ops"}
for key, value in values.items():
    print(f"export {key}={shlex.quote(value)}")
PY
  mv "$out.tmp" "$out"
  # shellcheck source=/dev/null
  . "$out"
  [[ "$MD_BUNDLE_SHA256" =~ ^[0-9a-f]{64}$ ]] || die "tpupod-bundle-sha256 is not a sha256"
  [[ "$MD_STACK" =~ ^[A-Za-z0-9._-]+$ ]] || die "tpupod-stack is not a stack name: $MD_STACK"
  echo "watcher of stack $MD_STACK, bundle $MD_BUNDLE_SHA256"
}

# supervise: Restart=always without systemd; 0 (done) and 3 (gave up) end it, as in the unit.
supervise() {
  local rc extra
  read -r -a extra <<<"${TPUPOD_WATCH_ARGS:-}" # e.g. the local pod's shorter hang timeout
  while true; do
    "$TPUPOD_ROOT/current/.venv/bin/python" -m ops.fleet.oslogin --key "$TPUPOD_ROOT/ssh/id_ed25519" \
      --env-out "$TPUPOD_ROOT/ssh/login.env" || { sleep 5; continue; }
    set -a
    # shellcheck source=/dev/null
    . "$TPUPOD_ROOT/ssh/login.env"
    set +a
    rc=0
    (cd "$TPUPOD_ROOT/current" && exec .venv/bin/python -m ops watch --stack "$MD_STACK" \
      --spec "$TPUPOD_ROOT/node-spec.json" "${extra[@]}") &
    echo $! >"$TPUPOD_ROOT/watch.pid"
    wait $! || rc=$?
    echo "tpupod watch exited $rc"
    case "$rc" in 0 | 3) return "$rc" ;; esac
    sleep "${TPUPOD_WATCHER_RESTART_S:-5}"
  done
}

phase_service() {
  local unit="/etc/systemd/system/tpupod-watcher.service"
  mkdir -p "$TPUPOD_ROOT/ssh" "$TPUPOD_ROOT/state"
  chmod 0700 "$TPUPOD_ROOT/ssh"
  if [ -d /run/systemd/system ] && [ -z "${TPUPOD_NO_SYSTEMD:-}" ]; then
    attr tpupod-watcher-unit | sed -e "s|@TPUPOD_ROOT@|$TPUPOD_ROOT|g" -e "s|@STACK@|$MD_STACK|g" \
      >"$unit.tmp"
    mv "$unit.tmp" "$unit"
    systemctl daemon-reload
    systemctl enable tpupod-watcher.service
    systemctl restart tpupod-watcher.service # a new bundle: the new code
    echo "tpupod-watcher.service started"
    return 0
  fi
  export TPUPOD_SSH_VIA=internal
  export TPUPOD_STATE_DIR="$TPUPOD_ROOT/state" TPUPOD_WATCH_HOLDER="${TPUPOD_WATCH_HOLDER:-$(hostname)}"
  export -f supervise
  if [ -s "$TPUPOD_ROOT/watcher.pid" ] && kill -0 "$(cat "$TPUPOD_ROOT/watcher.pid")" 2>/dev/null; then
    echo "the watcher supervisor is running: leaving it"
    return 0
  fi
  # shellcheck disable=SC2016 # expanded by the child shell
  setsid bash -c 'echo $$ >"$TPUPOD_ROOT/watcher.pid"; exec bash -c supervise' \
    </dev/null >>"$TPUPOD_ROOT/watcher.log" 2>&1 &
  echo "watcher supervisor started (log $TPUPOD_ROOT/watcher.log)"
}

export -f phase_metadata phase_service supervise

watcher_main() {
  mkdir -p "$TPUPOD_ROOT" "$BOOTSTRAP_STATE"
  chmod 0700 "$BOOTSTRAP_STATE"
  cd "$TPUPOD_ROOT"
  exec 9>"$BOOTSTRAP_STATE/lock"
  flock 9
  rm -f "$BOOTSTRAP_STATE"/md.*
  record begin start
  phase metadata 120 phase_metadata
  # shellcheck source=/dev/null
  . "$BOOTSTRAP_STATE/metadata.sh"
  export PATH="$TPUPOD_ROOT/bin:$PATH"
  if [ -n "${TPUPOD_WATCHER_CODE:-}" ]; then # the local pod's VM: this checkout, synced already
    # The bundle still comes and is verified as on GCP (the same grant, the same request); the
    # code that runs is the checkout, whose environment is synced already.
    phase bundle 600 phase_bundle
    ln -sfn "$TPUPOD_WATCHER_CODE" "$TPUPOD_ROOT/current.tmp"
  else
    # Debian's image has python3 but no pip, which the hash-pinned uv install uses (signed apt).
    python3 -m pip --version >/dev/null 2>&1 ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip; }
    phase uv 300 phase_uv
    phase bundle 600 phase_bundle
    phase sync 1800 phase_sync
    ln -sfn "bundles/$MD_BUNDLE_SHA256" "$TPUPOD_ROOT/current.tmp"
  fi
  mv -T "$TPUPOD_ROOT/current.tmp" "$TPUPOD_ROOT/current"
  phase service 120 phase_service 9>&-
  record finish service "watcher started"
  log finish "watcher started"
}

watcher_main "$@"
