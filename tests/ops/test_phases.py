"""The recovery table (ops.phases) and the persisted incident: no I/O but a tmp file, no clock."""

from __future__ import annotations

import pytest

from ops.incident import Incident, IncidentStore, WatchState
from ops.phases import (
    DRIVEN,
    OBSERVES,
    TABLE,
    Event,
    Phase,
    Step,
    advance,
    bootstrap_event,
    clock_event,
    operation_event,
    slice_event,
)
from ops.provider import SliceState


def test_every_driven_phase_says_what_it_observes():
    assert set(OBSERVES) == DRIVEN
    assert Phase.WATCHING not in DRIVEN and Phase.AWAITING_RESUME not in DRIVEN


@pytest.mark.parametrize(
    ("phase", "events", "steps", "end"),
    [
        # a recreate: delete, create, READY, bootstrap, then the observation table again
        (
            Phase.PENDING_RECREATE,
            [Event.WAITING, Event.DUE, Event.RUNNING, Event.DONE, Event.RUNNING, Event.DONE,
             Event.RUNNING, Event.DONE, Event.RUNNING, Event.DONE],
            [Step.NONE, Step.DELETE, Step.NONE, Step.CREATE, Step.NONE, Step.RECREATED,
             Step.NONE, Step.READY, Step.NONE, Step.BOOTSTRAPPED],
            Phase.AWAITING_RESUME,
        ),
        # a stockout on create: back off, create again; no failure is charged
        (
            Phase.AWAITING_CREATE,
            [Event.STOCKOUT, Event.WAITING, Event.DUE, Event.DONE],
            [Step.STOCKOUT, Step.NONE, Step.CREATE, Step.RECREATED],
            Phase.AWAITING_READY,
        ),
        # the new node is preempted before READY: recreate again, not a failure
        (Phase.AWAITING_READY, [Event.GONE], [Step.RETRY], Phase.PENDING_RECREATE),
        (Phase.AWAITING_CREATE, [Event.FAILED], [Step.RETRY], Phase.PENDING_RECREATE),
        (Phase.AWAITING_DELETE, [Event.DEADLINE], [Step.RETRY], Phase.PENDING_RECREATE),
        # a bootstrap that fails is judged (and charged) by the observation table
        (Phase.AWAITING_BOOTSTRAP, [Event.FAILED], [Step.HAND_BACK], Phase.WATCHING),
        (Phase.AWAITING_BOOTSTRAP, [Event.DEADLINE], [Step.REBUILD], Phase.PENDING_RECREATE),
        (Phase.PENDING_RESTART, [Event.WAITING, Event.DUE], [Step.NONE, Step.RESTART],
         Phase.AWAITING_RESUME),
        (Phase.PENDING_RESTART, [Event.GONE], [Step.HAND_BACK], Phase.WATCHING),
    ],
)  # fmt: skip
def test_paths_through_the_table(phase, events, steps, end):
    taken = []
    for event in events:
        transition = advance(phase, event)
        phase = transition.phase
        taken.append(transition.step)
    assert (taken, phase) == (steps, end)


def test_no_step_is_ever_charged_for_capacity():
    assert all(step is not Step.REBUILD for (_, event), (_, step) in TABLE.items()
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
