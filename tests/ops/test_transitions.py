"""The recovery table (ops.watch.transitions): its paths, every row applied by `Watcher.on` and
journaled, nothing else changing a phase, its generated drawing current; the waiting phases'
events (ops.watch.judge) and the persisted incident. No I/O but tmp files, no clock."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pytest

from ops.cloud.slice import SliceState
from ops.cloud.target import SshSettings, Target
from ops.cloud.tpu import TpuProvider
from ops.watch import drawing, observe, transitions, watcher
from ops.watch.deadlines import Limits
from ops.watch.incident import Incident, IncidentStore, WatchState
from ops.watch.journal import Journal
from ops.watch.judge import bootstrap_event, clock_event, operation_event, slice_event
from ops.watch.transitions import JUDGED, TABLE, WAITS_FOR, Action, Event, Phase, advance
from tests.ops.conftest import dummy_token

ROOT = Path(__file__).resolve().parents[2]


def test_every_phase_is_judged_or_waits_for_one_thing():
    assert set(WAITS_FOR) | set(JUDGED) == set(Phase) and not set(WAITS_FOR) & set(JUDGED)
    assert {p for p, _ in TABLE} == set(Phase)


@pytest.mark.parametrize(
    ("phase", "events", "actions", "end"),
    [
        # a recreate: delete, create, READY, bootstrap, then the observation table again
        (
            Phase.PENDING_RECREATE,
            [Event.WAITING, Event.DUE, Event.RUNNING, Event.DONE, Event.RUNNING, Event.DONE,
             Event.RUNNING, Event.DONE, Event.RUNNING, Event.DONE],
            [Action.NONE, Action.DELETE, Action.NONE, Action.CREATE, Action.NONE, Action.RECREATED,
             Action.NONE, Action.READY, Action.NONE, Action.BOOTSTRAPPED],
            Phase.AWAITING_RESUME,
        ),
        # a stockout on create: back off, create again; no failure is charged
        (
            Phase.AWAITING_CREATE,
            [Event.STOCKOUT, Event.WAITING, Event.DUE, Event.DONE],
            [Action.STOCKOUT, Action.NONE, Action.CREATE, Action.RECREATED],
            Phase.AWAITING_READY,
        ),
        # the new node is preempted before READY: recreate again, not a failure
        (Phase.AWAITING_READY, [Event.GONE], [Action.RETRY], Phase.PENDING_RECREATE),
        (Phase.AWAITING_CREATE, [Event.FAILED], [Action.RETRY], Phase.PENDING_RECREATE),
        (Phase.AWAITING_DELETE, [Event.DEADLINE], [Action.RETRY], Phase.PENDING_RECREATE),
        # a bootstrap that fails is judged (and charged) by the observation table
        (Phase.AWAITING_BOOTSTRAP, [Event.FAILED], [Action.HAND_BACK], Phase.WATCHING),
        (Phase.AWAITING_BOOTSTRAP, [Event.DEADLINE], [Action.REBUILD], Phase.PENDING_RECREATE),
        (Phase.PENDING_RESTART, [Event.WAITING, Event.DUE], [Action.NONE, Action.RESTART],
         Phase.AWAITING_RESUME),
        (Phase.PENDING_RESTART, [Event.GONE], [Action.HAND_BACK], Phase.WATCHING),
        # the judged phases: a notice, then the node goes; a crash restarted and resumed
        (Phase.WATCHING, [Event.CALM, Event.NOTICE, Event.SLICE_LOST],
         [Action.NONE, Action.NOTE_NOTICE, Action.OPEN_RECREATE], Phase.PENDING_RECREATE),
        (Phase.WATCHING, [Event.JOB_FAILED, Event.WAITING, Event.DUE, Event.CALM, Event.RESUMED],
         [Action.OPEN_RESTART, Action.NONE, Action.RESTART, Action.NONE, Action.CLOSE],
         Phase.WATCHING),
        (Phase.AWAITING_RESUME, [Event.JOB_PREEMPTED], [Action.RESTART_FREE],
         Phase.AWAITING_RESUME),
        (Phase.AWAITING_RESUME, [Event.ALL_DONE], [Action.FINISH], Phase.WATCHING),
    ],
)  # fmt: skip
def test_paths_through_the_table(phase, events, actions, end):
    taken = []
    for event in events:
        transition = advance(phase, event)
        phase = transition.phase if transition else phase
        taken.append(transition.action if transition else Action.NONE)
    assert (taken, phase) == (actions, end)


def test_no_step_is_ever_charged_for_capacity():
    assert all(action is not Action.REBUILD for (_, event), (_, action) in TABLE.items()
               if event is Event.STOCKOUT)  # fmt: skip


@pytest.mark.parametrize(
    ("args", "event"),
    [
        ((False, 0, False, 5.0, 10.0), Event.RUNNING),
        ((False, 0, False, 11.0, 10.0), Event.DEADLINE),
        ((True, 0, False, 1.0, 10.0), Event.DONE),
        ((True, 8, True, 1.0, 10.0), Event.STOCKOUT),
        ((True, 13, False, 1.0, 10.0), Event.FAILED),
    ],
)
def test_operation_event(args, event):
    assert operation_event(*args) is event


def test_slice_and_bootstrap_events():
    assert clock_event(5.0, 6.0) is Event.WAITING and clock_event(6.0, 6.0) is Event.DUE
    assert slice_event(SliceState.CREATING, 1, 10) is Event.RUNNING
    assert slice_event(SliceState.CREATING, 11, 10) is Event.DEADLINE
    assert slice_event(SliceState.READY, 11, 10) is Event.DONE
    assert slice_event(SliceState.PREEMPTED, 1, 10) is Event.GONE
    assert bootstrap_event(SliceState.READY, ["ok", None], 1, 10) is Event.RUNNING
    assert bootstrap_event(SliceState.READY, ["ok", "ok"], 1, 10) is Event.DONE
    assert bootstrap_event(SliceState.READY, ["ok", "failed"], 1, 10) is Event.FAILED
    assert bootstrap_event(SliceState.READY, ["running"], 11, 10) is Event.DEADLINE
    assert bootstrap_event(SliceState.PREEMPTED, [], 1, 10) is Event.GONE


def test_incident_round_trips_through_its_file(tmp_path):
    store = IncidentStore(tmp_path / "incident.json")
    assert store.load() is None
    inc = Incident("preemption", "slice PREEMPTED", 1.0, 12, {"recreated": 2.0},
                   Phase.AWAITING_CREATE, 1.5, operation="projects/p/locations/z/operations/7",
                   stockouts=1)  # fmt: skip
    store.save(WatchState(failures=1, preemptions=2, since=3.0, last_step=12, incident=inc))
    loaded = store.load()
    assert loaded.incident == inc and loaded.incident.phase is Phase.AWAITING_CREATE
    assert (loaded.failures, loaded.preemptions, loaded.since) == (1, 2, 3.0)
    assert [p.name for p in tmp_path.iterdir()] == ["incident.json"]  # no temp file left
    store.clear()
    assert store.load() is None


def _watcher(tmp_path) -> watcher.Watcher:
    spec = {"parent": "projects/p/locations/z", "node_id": "n", "node": {}}
    target = Target("s", "p", "z", "n", spec, SshSettings(None, None),
                    api_endpoint="http://127.0.0.1:9", token_file=dummy_token())  # fmt: skip
    return watcher.Watcher(TpuProvider(target), Journal(tmp_path / "journal.jsonl"))


@pytest.mark.parametrize(("phase", "event"), list(TABLE))
def test_every_row_is_applied_by_on_and_journaled(phase, event, tmp_path, monkeypatch):
    """Each (phase, event) row through the watcher's one entry point: the incident ends in the
    row's phase, the row's action ran once, and the journal has the transition."""
    taken: list[Action] = []
    recorder = {a: (lambda w, inc, detail, a=a: taken.append(a)) for a in Action}
    monkeypatch.setattr(watcher, "ACTIONS", recorder)
    w = _watcher(tmp_path)
    now = time.time()
    w.state.incident = Incident("crash", "r", now, 5, phase=phase, phase_since=now)
    to, action = TABLE[(phase, event)]
    w.on(event, "why", "hang")
    assert taken == [action]
    assert w.state.incident is not None and w.state.incident.phase is to
    moves = [e for e in w.journal.events if e["event"] == "transition"]
    assert [(m["phase"], m["on"], m["to"], m["action"]) for m in moves] == [
        (phase, event, to, action)
    ]


def _followed(phase: Phase, event: Event) -> tuple[Event, Phase, Action] | None:
    """A row out of the phase (phase, event) leads to: the event an action could hand back."""
    to, _ = TABLE[(phase, event)]
    return next(((e, *TABLE[(p, e)]) for (p, e) in TABLE if p is to), None)


@pytest.mark.parametrize(("phase", "event"),
                         [r for r, (_, a) in TABLE.items() if a is not Action.FINISH])  # fmt: skip
def test_an_action_that_hands_back_an_event_takes_exactly_the_next_row(
    phase, event, tmp_path, monkeypatch
):
    """Actions return events (`Then`); `on` applies the row for it in turn, each transition
    journaled once, and stops when an action returns nothing."""
    to, first = TABLE[(phase, event)]
    follow, to2, second = _followed(phase, event)
    taken: list[Action] = []

    def act(w, inc, detail, a):
        taken.append(a)
        return transitions.Then(follow, "next") if len(taken) == 1 else None

    monkeypatch.setattr(
        watcher, "ACTIONS", {a: (lambda w, i, d, a=a: act(w, i, d, a)) for a in Action}
    )
    w = _watcher(tmp_path)
    now = time.time()
    w.state.incident = Incident("crash", "r", now, 5, phase=phase, phase_since=now)
    w.on(event, "why", "hang")
    assert taken == [first, second]
    moves = [(m["phase"], m["on"], m["to"], m["action"])
             for m in w.journal.events if m["event"] == "transition"]  # fmt: skip
    assert moves == [(phase, event, to, first), (to, follow, to2, second)]


@pytest.mark.parametrize("event", [e for (p, e), (_, a) in TABLE.items()
                                   if p is Phase.WATCHING and a in transitions.OPENS])  # fmt: skip
def test_with_no_incident_open_a_judged_event_opens_one_of_its_kind(event, tmp_path, monkeypatch):
    monkeypatch.setattr(watcher, "ACTIONS", {a: lambda *_: None for a in Action})
    w = _watcher(tmp_path)
    w.on(event, "worker 1 heartbeat 99s old", "hang")
    expected = {Event.NOTICE: "preemption", Event.FATAL: "fatal", Event.NEW_BUNDLE: "rollout",
                Event.UNKNOWN_STATE: "unknown-state"}  # fmt: skip
    expected = expected.get(event, "hang")
    assert (
        w.state.incident.kind == expected
        and w.state.incident.phase is TABLE[(Phase.WATCHING, event)][0]
    )
    assert [e["event"] for e in w.journal.events] == ["detected", "transition"]


@pytest.mark.parametrize("phase", list(Phase))
def test_a_pair_not_in_the_table_changes_nothing(phase, tmp_path, monkeypatch):
    monkeypatch.setattr(watcher, "ACTIONS", {})  # any action taken would raise KeyError
    w = _watcher(tmp_path)
    w.state.incident = Incident("crash", "r", 1.0, 5, phase=phase, phase_since=1.0)
    for event in Event:
        if (phase, event) not in TABLE:
            assert w.on(event) is None
    assert w.state.incident.phase is phase and w.journal.events == []


def _phase_writers(path: Path) -> list[str]:
    """Where a module assigns an attribute named `phase` (or calls setattr with it)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute) and sub.attr == "phase":
                    found.append(f"{path.name}:{node.lineno}")
    return found


def _body(source: list[str], name: str) -> tuple[int, int]:
    start = next(i for i, line in enumerate(source, 1) if f"def {name}(" in line)
    return start, next(i for i, line in enumerate(source, 1) if i > start and "def " in line)


def test_nothing_but_on_changes_a_phase():
    """The phase is written in one place, `Watcher._enter` (one row), and only `on` calls it."""
    writers = [w for p in sorted((ROOT / "ops").rglob("*.py")) for w in _phase_writers(p)]
    source = (ROOT / "ops/watch/watcher.py").read_text().splitlines()
    enter_start, enter_end = _body(source, "_enter")
    assert writers and all(w.startswith("watcher.py:") for w in writers), writers
    assert all(enter_start < int(w.split(":")[1]) < enter_end for w in writers), writers
    on_start, on_end = _body(source, "on")
    callers = [i for i, line in enumerate(source, 1) if "self._enter(" in line]
    assert callers and all(on_start < i < on_end for i in callers), callers
    actions = (ROOT / "ops/watch/actions.py").read_text() + (
        ROOT / "ops/watch/capacity.py"
    ).read_text()
    assert "w.on(" not in actions and "w.drive(" not in actions  # actions return events


def test_the_negative_control_finds_a_phase_written_elsewhere(tmp_path):
    rogue = tmp_path / "rogue.py"
    rogue.write_text("def f(inc):\n    inc.phase = 'watching'\n")
    assert _phase_writers(rogue) == ["rogue.py:2"]


def test_the_drawing_in_docs_is_generated_from_the_table():
    drawn = (ROOT / "docs/recovery-table.md").read_text()
    assert drawn == drawing.markdown(), "run: uv run python -m ops.watch > docs/recovery-table.md"


@pytest.mark.parametrize("state", [SliceState.UNKNOWN, SliceState.UNRECOGNIZED])
def test_a_node_awaited_ready_in_a_state_with_its_own_deadline_ends_at_that_one(state):
    """Before: a recreated node in Google's UNKNOWN (or a state the client cannot name) was
    waited on for the phase's ready deadline (30 minutes on GCP), not its own."""
    limits = Limits(failed_repair=5.0, unknown_state=7.0)
    own = {SliceState.UNKNOWN: 5.0, SliceState.UNRECOGNIZED: 7.0}[state]
    assert slice_event(state, own + 1, 1800, own - 1, limits) is Event.RUNNING
    assert slice_event(state, own + 1, 1800, own + 1, limits) is Event.DEADLINE
    # a transition without a deadline of its own keeps the phase's
    assert slice_event(SliceState.CREATING, 60, 1800, 60, limits) is Event.RUNNING


def test_the_node_observer_times_the_state_it_sees_not_the_phase():
    """The awaited node is timed per state on the incident (persisted: a restarted watch goes
    on): CREATING for a while, then UNKNOWN ends at failed_repair counted from UNKNOWN."""
    from types import SimpleNamespace

    from ops.watch import observe
    from ops.watch.deadlines import WatchConfig

    seen = SimpleNamespace(state=SliceState.CREATING)
    w = SimpleNamespace(describe=lambda: seen, config=WatchConfig(limits=Limits(failed_repair=0.2)))
    inc = Incident("preemption", "slice PREEMPTED", 1.0, 0)
    assert observe.node(w, inc, 100.0, 1800.0)[0] is Event.RUNNING
    seen.state = SliceState.UNKNOWN
    assert observe.node(w, inc, 100.3, 1800.0)[0] is Event.RUNNING  # just entered UNKNOWN
    time.sleep(0.3)
    event, why = observe.node(w, inc, 100.6, 1800.0)
    assert event is Event.DEADLINE and "failed_repair" in why, why


def test_an_operation_just_issued_is_looked_at_soon_then_at_the_poll():
    """The create waits on the look that sees the delete done: the first looks come at 0.1 s,
    then a quarter of the time waited, never past the poll; other phases (and no incident, or a
    closed one) keep the poll's schedule (None)."""
    now, poll = 1000.0, 0.5
    waiting = Incident("preemption", "r", now, 5, phase=Phase.AWAITING_DELETE, phase_since=now)
    looks = [observe.quick_look(waiting, now + t, poll) for t in (0.0, 0.3, 1.0, 1.5, 2.0, 60.0)]
    assert looks == [0.1, 0.1, 0.25, 0.375, 0.5, 0.5]
    create = Incident("preemption", "r", now, 5, phase=Phase.AWAITING_CREATE, phase_since=now)
    assert observe.quick_look(create, now, poll) == 0.1
    for phase in set(Phase) - {p for p, w in WAITS_FOR.items() if w in observe.QUICK_WAITS}:
        other = Incident("preemption", "r", now, 5, phase=phase, phase_since=now)
        assert observe.quick_look(other, now, poll) is None, phase
    assert observe.quick_look(None, now, poll) is None
    waiting.phases["resumed"] = now
    assert observe.quick_look(waiting, now, poll) is None
