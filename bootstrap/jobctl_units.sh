# shellcheck shell=bash
# Sourced by jobctl.sh: the job's systemd units where systemd runs (GCP's workers), one instance
# of tpupod-job@.service per launch: run-ID a cold start, standby-ID a parked next attempt that
# keeps its instance when promoted. The unit to stop is read from a process's own cgroup.
TEMPLATE=tpupod-job@.service
# The system manager's units (GCP's workers). TPUPOD_SYSTEMD_SCOPE=user: a user manager's, the
# same units without root's /etc (tests run one: tests/bootstrap/test_standby_systemd.py).
if [ "${TPUPOD_SYSTEMD_SCOPE:-system}" = user ]; then
  SYSTEMCTL=(systemctl --user)
  UNIT_DIR="${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user"
else
  SYSTEMCTL=(systemctl)
  UNIT_DIR=/etc/systemd/system
fi

# systemd's own test (sd_booted), or a unit's mark: every process of a unit has INVOCATION_ID,
# also where the unit's sandbox shows it another /run. Never on a local pod's worker
# (TPUPOD_NO_SYSTEMD, from its environment), whose host may well run systemd.
have_systemd() {
  [ -z "${TPUPOD_NO_SYSTEMD:-}" ] && { [ -d /run/systemd/system ] || [ -n "${INVOCATION_ID:-}" ]; }
}

# Outside any unit (a unit sees /etc read-only): `start` installs it, `standby` only uses it.
install_unit() {
  local unit="$UNIT_DIR/$TEMPLATE"
  mkdir -p "$UNIT_DIR"
  sed -e "s|@TPUPOD_ROOT@|$ROOT|g" -e "s|@STOP_TIMEOUT@|$((STOP_TIMEOUT + 30))|g" \
    "$HERE/$TEMPLATE" >"$unit.tmp"
  if cmp -s "$unit.tmp" "$unit"; then
    rm -f "$unit.tmp"
  else
    mv "$unit.tmp" "$unit"
    "${SYSTEMCTL[@]}" daemon-reload
  fi
}

# start_instance MODE: a new instance of the template (MODE run or standby), named once.
start_instance() {
  "${SYSTEMCTL[@]}" start "tpupod-job@$1-$(date +%s%N).service"
}

# The unit that process $1 runs in (an instance of ours, or the older tpupod-job.service), or
# nothing: read before it is stopped, settled after.
unit_of() {
  local unit
  unit=$(grep -o 'tpupod-job[^/]*\.service' "/proc/$1/cgroup" 2>/dev/null) || return 0
  echo "${unit%%$'\n'*}"
}

# stop_unit UNIT: stopped (systemctl waits until its cgroup is empty: no leftover of the job
# holds the accelerator), and unloaded even where its main process was killed (`failed`).
stop_unit() {
  [ -n "$1" ] && have_systemd || return 0
  "${SYSTEMCTL[@]}" stop "$1" 2>/dev/null || true
  "${SYSTEMCTL[@]}" reset-failed "$1" 2>/dev/null || true
}

# stop_instances [KEEP]: every instance of ours still loaded but KEEP (a unit whose job ended
# while it kills what is left, a standby started but not yet in standby.json, the older
# tpupod-job.service); called only where no job runs.
stop_instances() {
  local unit
  have_systemd || return 0
  for unit in $("${SYSTEMCTL[@]}" list-units --all --plain --no-legend 'tpupod-job@*' \
    tpupod-job.service 2>/dev/null | awk '{print $1}'); do
    [ "$unit" = "${1:-}" ] || stop_unit "$unit"
  done
}
