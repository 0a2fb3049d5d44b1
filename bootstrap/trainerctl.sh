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
#   start        start the trainer; a no-op while it runs; exit 3 if it started but has already
#                exited (its code is in trainer.exit: the trainer's failure, not the launch's)
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
# /proc/PID/cwd is a physical path: compare with ROOT's.
ROOT_PHYSICAL="$(cd "$ROOT" 2>/dev/null && pwd -P || echo "$ROOT")"

have_systemd() { [ -d /run/systemd/system ]; }

# Pids in process group $1 whose working directory is one of our bundles: our trainer.
our_group_members() {
  local member
  for member in $(ps -eo pid=,pgid= | awk -v g="$1" '$2 == g {print $1}'); do
    case "$(readlink "/proc/$member/cwd" 2>/dev/null)" in
    "$ROOT_PHYSICAL"/bundles/*) echo "$member" ;;
    esac
  done
}

# The process group (= the wrapper's pid) of the running trainer, or nothing. The pid in the file
# counts only while it is our wrapper, or while its group still holds a process running from
# one of our bundles (a trainer whose wrapper died): pids are reused, and the file survives
# reboots.
trainer_pid() {
  local pid cmdline
  pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || cmdline=""
  if [[ "$cmdline" == *"trainerctl.sh __run"* ]] || [ -n "$(our_group_members "$pid")" ]; then
    echo "$pid"
  else
    return 1
  fi
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
  local pid member
  pid=$(trainer_pid) || return 1
  member=$(our_group_members "$pid")
  member=${member%%$'\n'*} # the first (no `| head`: SIGPIPE under pipefail)
  [ -n "$member" ] || return 1
  basename "$(readlink "/proc/$member/cwd")"
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
    if [ -f "$EXITFILE" ]; then
      echo "trainer started and exited $(cat "$EXITFILE") at once; see $LOGFILE" >&2
      return 3
    fi
    sleep 0.1
  done
  echo "trainer did not start; $(cmd_status || true); see $LOGFILE" >&2
  return 1
}

# The same under systemd: the unit's main process (the wrapper) is a session and group leader
# too, and this honours this call's stop timeout rather than the unit's.
cmd_stop() {
  local pid waited=0 killed=""
  if ! pid=$(trainer_pid); then
    if have_systemd; then systemctl stop "$UNIT" || true; fi
    echo "trainer not running"
    return 0
  fi
  echo "stopping trainer (process group $pid), SIGKILL after ${STOP_TIMEOUT}s"
  kill -TERM -- "-$pid" 2>/dev/null || true
  # A hung (SIGSTOPped) trainer handles its SIGTERM only once it runs again.
  kill -CONT -- "-$pid" 2>/dev/null || true
  while kill -0 -- "-$pid" 2>/dev/null; do
    if [ "$waited" -ge $((STOP_TIMEOUT * 10)) ]; then
      [ -n "$killed" ] || echo "trainer still running after ${STOP_TIMEOUT}s: SIGKILL"
      kill -KILL -- "-$pid" 2>/dev/null || true
      killed=1
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  # SIGKILL took the wrapper too: record what it could not.
  if [ -n "$killed" ] && [ ! -f "$EXITFILE" ]; then echo 137 >"$EXITFILE"; fi
  rm -f "$PIDFILE"
  if have_systemd; then
    systemctl stop "$UNIT" || true # nothing left in it: settles the unit's state at once
  fi
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
  local key value child rc args=()
  # Into the bundle first: from the pidfile on, the bundle is readable from our cwd.
  cd -P "$ROOT/current"
  echo $$ >"$PIDFILE.tmp"
  mv "$PIDFILE.tmp" "$PIDFILE"
  while IFS='=' read -r key value; do
    [[ "$key" =~ ^[A-Z_][A-Z0-9_]*$ ]] && export "$key=$value"
  done <"$ENVFILE"
  read -r -a args <<<"${TPUPOD_TRAINER_ARGS:-}"
  # A handled (not ignored) signal is reset to the default in the child, so the trainer sees
  # SIGTERM as usual; one arriving before the fork must not kill the wrapper either.
  trap 'echo "trainerctl: SIGTERM"' TERM
  echo "trainerctl: $(date -u +%FT%T.%3NZ) starting python -m trainer ${args[*]} in $PWD"
  if [ -n "${INVOCATION_ID:-}" ]; then
    # Under systemd stdout is the journal; keep trainer.log as well. The unit's SIGTERM must
    # not take tee down while the trainer still writes (SIGPIPE in the middle of its save).
    .venv/bin/python -m trainer "${args[@]}" > >(trap '' TERM && exec tee -a "$LOGFILE") 2>&1 &
  else
    .venv/bin/python -m trainer "${args[@]}" &
  fi
  child=$!
  # The group's SIGTERM is for the trainer (it saves, then exits); the wrapper ignores it and
  # waits for the exit status. (A trapped signal would interrupt `wait`, and a second `wait`
  # can lose the status in a race.)
  trap '' TERM
  rc=0
  wait "$child" || rc=$?
  echo "$rc" >"$EXITFILE.tmp"
  mv "$EXITFILE.tmp" "$EXITFILE"
  echo "trainerctl: $(date -u +%FT%T.%3NZ) trainer exited with $rc"
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
