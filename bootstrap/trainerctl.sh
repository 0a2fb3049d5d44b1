#!/usr/bin/env bash
# trainerctl.sh start|stop|clear-locks|status|bundle: the one supervisor contract (docs/seams.md).
#
# Used by startup.sh and by the ops layer over SSH:
#   "${TPUPOD_ROOT:-/var/lib/tpupod}/current/bootstrap/trainerctl.sh" stop
# Where systemd runs, the trainer is the unit tpupod-trainer.service; elsewhere (the local pod) it
# runs in its own session via setsid with its pid (= process group) in trainer.pid. Either way a
# wrapper (`__run`) starts `python -m trainer $TPUPOD_TRAINER_ARGS` from $TPUPOD_ROOT/current with
# trainer.env, and writes the trainer's exit code to trainer.exit when it ends. Nothing restarts a
# trainer on its own: a multi-host job restarts as a whole, from the ops layer.
#   start        start the trainer; a no-op while it runs
#   stop         SIGTERM to its process group, SIGKILL after $TPUPOD_STOP_TIMEOUT (60) s; waits
#   clear-locks  remove libtpu's lockfile (refused while the trainer runs)
#   status       print running/exited/stopped; exit 0 only while it runs
#   bundle       print the sha256 of the bundle the running trainer uses; exit 1 if none runs
set -euo pipefail

ROOT="${TPUPOD_ROOT:-/var/lib/tpupod}"
PIDFILE="$ROOT/trainer.pid"
EXITFILE="$ROOT/trainer.exit"
LOGFILE="$ROOT/trainer.log"
ENVFILE="$ROOT/trainer.env"
STOP_TIMEOUT="${TPUPOD_STOP_TIMEOUT:-60}"
LOCKFILE="${TPUPOD_LIBTPU_LOCKFILE:-/tmp/libtpu_lockfile}"
UNIT=tpupod-trainer.service
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"

have_systemd() { [ -d /run/systemd/system ]; }

# The pid of the running trainer wrapper, or nothing. A pid from the file counts only while that
# process is our wrapper: pids are reused, and the file survives reboots.
trainer_pid() {
  local pid
  pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'trainerctl.sh __run' || return 1
  echo "$pid"
}

cmd_status() {
  local pid
  if pid=$(trainer_pid); then
    echo "running pid $pid"
  elif [ -f "$EXITFILE" ]; then
    echo "exited $(cat "$EXITFILE")"
    return 3
  else
    echo "stopped"
    return 3
  fi
}

cmd_bundle() {
  local pid cwd
  pid=$(trainer_pid) || return 1
  cwd=$(readlink "/proc/$pid/cwd") || return 1
  basename "$cwd"
}

install_unit() {
  local unit="/etc/systemd/system/$UNIT"
  sed -e "s|@TPUPOD_ROOT@|$ROOT|g" -e "s|@STOP_TIMEOUT@|$((STOP_TIMEOUT + 30))|g" \
    "$HERE/$UNIT" >"$unit.tmp"
  if cmp -s "$unit.tmp" "$unit"; then
    rm -f "$unit.tmp"
  else
    mv "$unit.tmp" "$unit"
    systemctl daemon-reload
  fi
}

cmd_start() {
  local pid
  if pid=$(trainer_pid); then
    echo "trainer already running (pid $pid)"
    return 0
  fi
  [ -f "$ENVFILE" ] || {
    echo "no $ENVFILE: run startup.sh first" >&2
    return 1
  }
  rm -f "$EXITFILE" "$PIDFILE"
  if have_systemd; then
    install_unit
    systemctl start "$UNIT"
  else
    # Own session and process group, detached from our stdio; the wrapper writes its pid.
    setsid bash "$ROOT/current/bootstrap/trainerctl.sh" __run </dev/null >>"$LOGFILE" 2>&1 &
  fi
  for _ in $(seq 100); do
    if pid=$(trainer_pid); then
      echo "trainer started (pid $pid)"
      return 0
    fi
    [ ! -f "$EXITFILE" ] || break
    sleep 0.1
  done
  echo "trainer did not start; $(cmd_status || true); see $LOGFILE" >&2
  return 1
}

cmd_stop() {
  local pid waited=0
  if have_systemd; then
    systemctl stop "$UNIT" || true
  fi
  pid=$(trainer_pid) || {
    echo "trainer not running"
    return 0
  }
  echo "stopping trainer (process group $pid), SIGKILL after ${STOP_TIMEOUT}s"
  kill -TERM -- "-$pid" 2>/dev/null || true
  while kill -0 -- "-$pid" 2>/dev/null; do
    if [ "$waited" -ge $((STOP_TIMEOUT * 10)) ]; then
      echo "trainer still running after ${STOP_TIMEOUT}s: SIGKILL"
      kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  rm -f "$PIDFILE"
  echo "trainer stopped (exit code $(cat "$EXITFILE" 2>/dev/null || echo unknown))"
}

cmd_clear_locks() {
  if trainer_pid >/dev/null; then
    echo "trainer is running: not clearing locks" >&2
    return 1
  fi
  rm -f "$PIDFILE"
  if [ -e "$LOCKFILE" ]; then
    rm -f "$LOCKFILE"
    echo "removed $LOCKFILE"
  fi
}

# The wrapper: the process group leader. It outlives the trainer to record its exit code.
cmd_run() {
  local key value child rc interrupted args=()
  echo $$ >"$PIDFILE.tmp"
  mv "$PIDFILE.tmp" "$PIDFILE"
  while IFS='=' read -r key value; do
    [[ "$key" =~ ^[A-Z_][A-Z0-9_]*$ ]] && export "$key=$value"
  done <"$ENVFILE"
  read -r -a args <<<"${TPUPOD_TRAINER_ARGS:-}"
  cd -P "$ROOT/current"
  # SIGTERM reaches the whole group: the trainer saves and exits; we keep waiting for it.
  trap 'interrupted=1; echo "trainerctl: SIGTERM, waiting for the trainer"' TERM
  echo "trainerctl: $(date -u +%FT%TZ) starting python -m trainer ${args[*]} in $PWD"
  if [ -n "${INVOCATION_ID:-}" ]; then
    # Under systemd stdout is the journal; keep trainer.log as well.
    .venv/bin/python -m trainer "${args[@]}" > >(tee -a "$LOGFILE") 2>&1 &
  else
    .venv/bin/python -m trainer "${args[@]}" &
  fi
  child=$!
  # A trapped signal interrupts `wait` (status > 128); only an uninterrupted wait has the status.
  while true; do
    interrupted=0 rc=0
    wait "$child" || rc=$?
    [ "$interrupted" = 1 ] || break
  done
  echo "$rc" >"$EXITFILE.tmp"
  mv "$EXITFILE.tmp" "$EXITFILE"
  echo "trainerctl: $(date -u +%FT%TZ) trainer exited with $rc"
  rm -f "$PIDFILE"
  exit "$rc"
}

case "${1:-}" in
start) cmd_start ;;
stop) cmd_stop ;;
clear-locks) cmd_clear_locks ;;
status) cmd_status ;;
bundle) cmd_bundle ;;
__run) cmd_run ;;
*)
  echo "usage: $0 start|stop|clear-locks|status|bundle" >&2
  exit 2
  ;;
esac
