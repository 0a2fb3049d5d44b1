#!/usr/bin/env bash
# jobctl.sh start|stop|clear-locks|status|bundle: the one supervisor contract (docs/seams.md).
#
# Used by startup.sh and by the ops layer over SSH:
#   "${TPUPOD_ROOT:-/var/lib/tpupod}/current/bootstrap/jobctl.sh" stop
# Where systemd runs, the job is an instance of the unit tpupod-job@.service (run-ID; a promoted
# standby keeps its standby-ID); elsewhere (the local pod) it runs in its own session via setsid.
# Either way its pid (= process group) is in job.pid and the group's leader is bootstrap/jobrun.py
# (`__run`), which runs the job's `run` with its environment from $TPUPOD_ROOT/current/job, and
# writes the job's exit code to job.exit when it ends. Nothing restarts a job on its own: a
# multi-host job restarts as a whole, from the ops layer.
#   start        start the job (TPUPOD_ATTEMPT=N: as attempt N); a no-op while it runs; exit 3 if
#                it started but has already exited (its code is in job.exit: the job's failure,
#                not the launch's)
#   stop         SIGTERM to its process group, SIGKILL after $TPUPOD_STOP_TIMEOUT s (default: the
#                job's grace_s, TPUPOD_GRACE_S in job.env); waits
#   clear-locks  remove libtpu's lockfile (refused while the job runs)
#   status       print running/exited/stopped; exit 0 only while it runs
#   bundle       print the sha256 of the bundle the running job uses; exit 1 if none runs
#   standby      park the job's next attempt, its imports done (the job's launcher calls it)
# Sourced beside it: the systemd units (jobctl_units.sh) and the standby (jobctl_standby.sh).
set -euo pipefail

ROOT="${TPUPOD_ROOT:-/var/lib/tpupod}"
PIDFILE="$ROOT/job.pid"
EXITFILE="$ROOT/job.exit"
LOGFILE="$ROOT/job.log"
ENVFILE="$ROOT/job.env"
ATTEMPTFILE="$ROOT/job.attempt"
grace=$(sed -n 's/^TPUPOD_GRACE_S=\([0-9][0-9]*\)$/\1/p' "$ENVFILE" 2>/dev/null || true)
STOP_TIMEOUT="${TPUPOD_STOP_TIMEOUT:-${grace:-60}}"
LOCKFILE="${TPUPOD_LIBTPU_LOCKFILE:-/tmp/libtpu_lockfile}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)"
# /proc/PID/cwd is a physical path: compare with ROOT's.
ROOT_PHYSICAL="$(cd "$ROOT" 2>/dev/null && pwd -P || echo "$ROOT")"
# shellcheck source=SCRIPTDIR/jobctl_units.sh
. "$HERE/jobctl_units.sh"
# shellcheck source=SCRIPTDIR/jobctl_standby.sh
. "$HERE/jobctl_standby.sh"

# The launcher's environment, the same whoever starts the job (the startup script at boot, ops
# over SSH, sudo, a unit), so a job never depends on its caller's variables and a parked
# attempt's environment is the next start's. The job's own variables come from job.env (the
# contract) and its spec.
SYSTEM_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
MACHINE_NAMES=(HOME LANG LC_ALL TZ SSL_CERT_FILE SSL_CERT_DIR HTTPS_PROXY HTTP_PROXY NO_PROXY
  https_proxy http_proxy no_proxy)
launch_env() {
  local name line path="PATH=$SYSTEM_PATH" marks=(TPUPOD_NO_SYSTEMD)
  printf '%s\0' "TPUPOD_ROOT=$ROOT"
  # Under systemd, the manager's environment, which every unit starts with (its PATH and
  # whatever the image sets there; an SSH caller's forwarded LANG is not the machine's), with
  # systemd's marks of the unit that calls this (the launcher echoes to the journal); an escaped
  # value ($'...') is left out on both sides alike. Else the machine's home, locale, trust and
  # proxies, as the image or the local pod gives every process (a local worker's HOME is its
  # own), and no marks: a local worker's caller may be some unit of its host's, not the worker's.
  if have_systemd; then
    marks+=(INVOCATION_ID JOURNAL_STREAM)
    while IFS= read -r line; do
      if [[ "${line%%=*}" == PATH ]]; then
        path=$line
      elif [[ "$line" == [A-Za-z_]*=* ]] && [[ "${line#*=}" != "\$'"* ]] &&
        [[ "${line%%=*}" != TPUPOD_ROOT ]]; then
        printf '%s\0' "$line"
      fi
    done < <("${SYSTEMCTL[@]}" show-environment)
  else
    for name in "${MACHINE_NAMES[@]}"; do
      if [ -n "${!name:-}" ]; then printf '%s\0' "$name=${!name}"; fi
    done
  fi
  printf '%s\0' "$path"
  # Whether systemd is ours carries to the job's launcher (it calls `jobctl standby`).
  for name in "${marks[@]}"; do
    if [ -n "${!name:-}" ]; then printf '%s\0' "$name=${!name}"; fi
  done
}

# Execs "$@" with launch_env's environment alone: call it in a subshell or in the background
# (no shell lingers as the launcher's parent).
with_launch_env() {
  local clean
  mapfile -d '' -t clean < <(launch_env)
  exec env -i "${clean[@]}" "$@"
}

# Pids in process group $1 whose working directory is in one of our bundles: our job.
our_group_members() {
  local member
  for member in $(ps -eo pid=,pgid= | awk -v g="$1" '$2 == g {print $1}'); do
    case "$(readlink "/proc/$member/cwd" 2>/dev/null)" in
    "$ROOT_PHYSICAL"/bundles/*) echo "$member" ;;
    esac
  done
}

# The process group (= the launcher's pid) of the running job, or nothing. The pid in the file
# counts only while it is our launcher, or while its group still holds a process running from
# one of our bundles (a job whose launcher died): pids are reused, and the file survives
# reboots.
job_pid() {
  local pid cmdline
  pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || cmdline=""
  if [[ "$cmdline" == *"jobctl.sh __run"* ]] || [[ "$cmdline" == *"jobctl.sh __unit run-"* ]] ||
    [[ "$cmdline" == *"bootstrap/jobrun.py"* ]] ||
    [ -n "$(our_group_members "$pid")" ]; then
    echo "$pid"
  else
    return 1
  fi
}

cmd_status() {
  local pid
  if pid=$(job_pid); then
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
  local pid member dir
  pid=$(job_pid) || return 1
  member=$(our_group_members "$pid")
  member=${member%%$'\n'*} # the first (no `| head`: SIGPIPE under pipefail)
  [ -n "$member" ] || return 1
  dir=$(readlink "/proc/$member/cwd")
  dir=${dir#"$ROOT_PHYSICAL"/bundles/}
  echo "${dir%%/*}" # bundles/<sha> or bundles/<sha>/job
}

cmd_start() {
  local pid
  if pid=$(job_pid); then
    echo "job already running (pid $pid)"
    return 0
  fi
  [ -f "$ENVFILE" ] || {
    echo "no $ENVFILE: run startup.sh first" >&2
    return 1
  }
  if [ -n "${TPUPOD_ATTEMPT:-}" ]; then
    [[ "$TPUPOD_ATTEMPT" =~ ^[0-9]+$ ]] || {
      echo "TPUPOD_ATTEMPT=$TPUPOD_ATTEMPT is not a number" >&2
      return 2
    }
    echo "$TPUPOD_ATTEMPT" >"$ATTEMPTFILE"
  fi
  # The previous attempt's exit code stays readable (tpupod status) until this one exits.
  if [ -f "$EXITFILE" ]; then mv -f "$EXITFILE" "$ROOT/job.last-exit"; fi
  rm -f "$PIDFILE" "$ROOT/job.term"
  if promote_standby; then
    echo "job started (pid $(job_pid), attempt $(cat "$ATTEMPTFILE" 2>/dev/null || echo 1)): the standby"
    return 0
  elif have_systemd; then
    install_unit
    start_instance run
  else
    # Own session and process group, detached from our stdio; the wrapper writes its pid.
    with_launch_env setsid bash "$ROOT/current/bootstrap/jobctl.sh" __run \
      </dev/null >>"$LOGFILE" 2>&1 &
  fi
  for _ in $(seq 100); do
    if pid=$(job_pid); then
      echo "job started (pid $pid, attempt $(cat "$ATTEMPTFILE" 2>/dev/null || echo 1))"
      return 0
    fi
    if [ -f "$EXITFILE" ]; then
      echo "job started and exited $(cat "$EXITFILE") at once; see $LOGFILE" >&2
      return 3
    fi
    sleep 0.1
  done
  echo "job did not start; $(cmd_status || true); see $LOGFILE" >&2
  return 1
}

# The same under systemd: the unit's main process (the wrapper) is a session and group leader
# too, and this honours this call's stop timeout rather than the unit's.
cmd_stop() {
  local pid waited=0 killed="" unit standby
  if ! pid=$(job_pid); then
    if [ "${TPUPOD_KEEP_STANDBY:-}" = 1 ]; then
      standby=$(standby_pid) && standby=$(unit_of "$standby") || standby=""
      stop_instances "$standby" # what an ended job left, never the parked attempt
    else
      discard_standby
    fi
    echo "job not running"
    return 0
  fi
  unit=$(unit_of "$pid")
  echo "stopping job (process group $pid), SIGKILL after ${STOP_TIMEOUT}s"
  kill -TERM -- "-$pid" 2>/dev/null || true
  # A hung (SIGSTOPped) job handles its SIGTERM only once it runs again.
  kill -CONT -- "-$pid" 2>/dev/null || true
  while kill -0 -- "-$pid" 2>/dev/null; do
    if [ "$waited" -ge $((STOP_TIMEOUT * 10)) ]; then
      [ -n "$killed" ] || echo "job still running after ${STOP_TIMEOUT}s: SIGKILL"
      kill -KILL -- "-$pid" 2>/dev/null || true
      killed=1
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  # SIGKILL took the launcher too: record what it could not.
  if [ -n "$killed" ] && [ ! -f "$EXITFILE" ]; then echo 137 >"$EXITFILE"; fi
  rm -f "$PIDFILE"
  stop_unit "$unit" # nothing left in it: settles the unit's state at once
  echo "job stopped (exit code $(cat "$EXITFILE" 2>/dev/null || echo unknown))"
  # A restart's stop keeps the parked next attempt; any other stop discards it.
  [ "${TPUPOD_KEEP_STANDBY:-}" = 1 ] || discard_standby
}

cmd_clear_locks() {
  if job_pid >/dev/null; then
    echo "job is running: not clearing locks" >&2
    return 1
  fi
  rm -f "$PIDFILE"
  if [ -e "$LOCKFILE" ]; then
    rm -f "$LOCKFILE"
    echo "removed $LOCKFILE"
  fi
}

# The launcher (bootstrap/jobrun.py) as the process group leader, from the bundle: it outlives
# the job to record its exit code. The bundle's Python, isolated: stdlib only.
cmd_run() {
  cd -P "$ROOT/current"
  echo $$ >"$PIDFILE.tmp"
  mv "$PIDFILE.tmp" "$PIDFILE"
  with_launch_env .venv/bin/python -I -S bootstrap/jobrun.py
}

# A unit's instance (tpupod-job@.service): run-ID is a cold start, standby-ID a parked attempt.
cmd_unit() {
  case "${1:-}" in
  run-*) cmd_run ;;
  standby-*) cmd_park ;;
  *)
    echo "unknown instance '${1:-}': run-ID or standby-ID" >&2
    exit 2
    ;;
  esac
}

case "${1:-}" in
start) cmd_start ;;
stop) cmd_stop ;;
clear-locks) cmd_clear_locks ;;
status) cmd_status ;;
bundle) cmd_bundle ;;
__run) cmd_run ;;
standby) cmd_standby ;;
__standby) cmd_park ;;
__unit) cmd_unit "${2:-}" ;;
*)
  echo "usage: $0 start|stop|clear-locks|status|bundle|standby" >&2
  exit 2
  ;;
esac
