"""tpupod_job.worker: the one thread a save's slow part runs on (the local tier's writer, the
trainer's start of an Orbax save). It is started once and runs one task at a time; a task
handed while one runs is refused, and a task's error neither kills the thread nor is lost."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
from tpupod_job.worker import Worker


def test_one_thread_runs_every_task_one_at_a_time():
    worker, ran = Worker("test-worker"), []
    release = threading.Event()
    assert worker.submit(lambda: (release.wait(10), ran.append(threading.get_ident())))
    assert worker.busy()
    assert not worker.submit(ran.append, "refused")  # one still runs: the caller decides
    release.set()
    worker.join()
    assert not worker.busy()
    for _ in range(3):
        assert worker.submit(lambda: ran.append(threading.get_ident()))
        worker.join()
    assert len(ran) == 4 and len(set(ran)) == 1, ran  # no thread started per task
    assert ran[0] != threading.get_ident()


def test_an_error_goes_to_its_handler_and_the_thread_goes_on():
    errors, ran = [], []
    worker = Worker("test-worker", on_error=errors.append)

    def fails():
        raise OSError("disk full")

    assert worker.submit(fails)
    worker.join()
    assert [str(e) for e in errors] == ["disk full"]
    assert worker.submit(ran.append, "next")
    worker.join()
    assert ran == ["next"]


def test_a_failing_handler_does_not_stop_the_thread():
    def bad_handler(error):
        raise RuntimeError("handler broke")

    worker, ran = Worker("test-worker", on_error=bad_handler), []
    assert worker.submit(lambda: 1 / 0)
    worker.join()
    assert worker.submit(ran.append, "after")
    worker.join()
    assert ran == ["after"]


def test_by_default_an_error_prints_its_traceback(capsys):
    worker = Worker("test-worker")
    assert worker.submit(lambda: 1 / 0)
    worker.join()
    assert "ZeroDivisionError" in capsys.readouterr().err


def test_a_finished_tasks_arguments_are_let_go():
    """A save's arguments are its host copy of the state: the thread must not hold them while
    it waits for the next save."""

    class Copy:
        pass

    worker, copy = Worker("test-worker"), Copy()
    alive = weakref.ref(copy)
    assert worker.submit(lambda c: None, copy)
    worker.join()
    del copy
    gc.collect()
    assert alive() is None


def test_a_task_waiting_for_its_own_worker_is_refused():
    errors = []
    worker = Worker("test-worker", on_error=errors.append)
    assert worker.submit(lambda: worker.join())
    worker.join()
    assert [type(e) for e in errors] == [RuntimeError]


def test_a_thread_that_cannot_start_leaves_the_worker_free(monkeypatch):
    def no_threads_left(self):
        raise RuntimeError("can't start new thread")

    worker, ran = Worker("test-worker"), []
    with monkeypatch.context() as m:
        m.setattr(threading.Thread, "start", no_threads_left)
        with pytest.raises(RuntimeError, match="new thread"):
            worker.submit(ran.append, "lost")
    assert not worker.busy()
    assert worker.submit(ran.append, "next")
    worker.join()
    assert ran == ["next"]
