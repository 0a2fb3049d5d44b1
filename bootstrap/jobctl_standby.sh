# shellcheck shell=bash
# Sourced by jobctl.sh: the job's next attempt, parked with its imports done (jobrun.py standby,
# docs/proposals/standby-interpreter.md): started, promoted by `start`, discarded by a stop that
# is not a restart's.

# The next attempt (jobrun.py standby, its own session), parked or still importing, or nothing:
# standby.json's pid counts only while it is that launcher (pids are reused).
standby_pid() {
  local pid cmdline
  pid=$(sed -n 's/.*"pid": *\([0-9][0-9]*\).*/\1/p' "$ROOT/standby.json" 2>/dev/null) || return 1
  [ -n "$pid" ] || return 1
  cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ "$cmdline" == *"bootstrap/jobrun.py standby"* ]] && echo "$pid"
}

# Promotes the next attempt: this call's environment to standby.go, SIGUSR1 to its launcher,
# which checks it and takes job.pid (its job runs once its imports are done), or says why not in
# standby.refused (then: a cold start).
promote_standby() {
  local pid
  pid=$(standby_pid) || return 1
  rm -f "$ROOT/standby.refused"
  # The environment as a cold launcher would start with it: read by the same interpreter, so
  # its own start-up changes (the C locale's coercion to C.UTF-8) are in it too.
  (umask 077 && with_launch_env "$ROOT/current/.venv/bin/python" -I -S -c \
    'import os, sys; sys.stdout.buffer.write(b"\0".join(k + b"=" + v for k, v in os.environb.items()))' \
    >"$ROOT/standby.go.tmp") && mv "$ROOT/standby.go.tmp" "$ROOT/standby.go"
  kill -USR1 "$pid" 2>/dev/null || return 1
  for _ in $(seq 100); do
    if job_pid >/dev/null; then return 0; fi
    if [ -f "$ROOT/standby.refused" ]; then
      echo "standby refused: $(cat "$ROOT/standby.refused")" >&2
      discard_standby "$pid"
      return 1
    fi
    sleep 0.02
  done
  discard_standby "$pid"
  return 1
}

# Where no job runs (after a stop, before a start): the parked attempt's group killed, and under
# systemd every instance of ours stopped, one still starting included.
discard_standby() {
  local pid="${1:-}"
  [ -n "$pid" ] || pid=$(standby_pid) || pid=""
  [ -z "$pid" ] || kill -KILL -- "-$pid" 2>/dev/null || true
  stop_instances
  rm -f "$ROOT/standby.json" "$ROOT/standby.go"
}

# In a unit of its own under systemd (the job's stop empties the job's unit), else a session.
cmd_standby() {
  local pid
  if pid=$(standby_pid); then
    echo "standby already there (pid $pid)"
    return 0
  fi
  if have_systemd; then
    if [ ! -f "$UNIT_DIR/$TEMPLATE" ]; then
      echo "standby: no $UNIT_DIR/$TEMPLATE (a cold start installs it): none parked"
      return 0
    fi
    start_instance standby
  else
    with_launch_env setsid bash "$ROOT/current/bootstrap/jobctl.sh" __standby \
      </dev/null >>"$ROOT/logs/standby.log" 2>&1 &
  fi
  echo "standby starting"
}

cmd_park() {
  cd -P "$ROOT/current" || exit 1
  with_launch_env .venv/bin/python -I -S bootstrap/jobrun.py standby
}
