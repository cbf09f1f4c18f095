"""The simulation's schedule: a blocking step runs in a worker, in turns with the driver."""

from __future__ import annotations

import datetime as dt
import logging
import threading

from falcon_ray.devtools.simulate.schedule import ScheduledLoop, Scheduler, VirtualClock, Worker

START = dt.datetime(2026, 1, 5)


def _run(scheduler: Scheduler, until: float) -> None:
    while scheduler.next_at() is not None and scheduler.next_at() <= until:
        scheduler.run_next()


def test_a_worker_waits_in_virtual_time_while_the_schedule_runs_other_things():
    clock = VirtualClock(START)
    scheduler = Scheduler(clock)
    t0 = clock.monotonic()
    trail: list[tuple[str, float]] = []

    def blocking_step() -> str:
        trail.append(("step begins", clock.monotonic() - t0))
        clock.wait(threading.Event(), 2.0)  # an operation poll: parks, the driver runs on
        trail.append(("after the first wait", clock.monotonic() - t0))
        clock.sleep(3.0)
        trail.append(("step ends", clock.monotonic() - t0))
        return "done"

    loop = ScheduledLoop("ops", blocking_step, lambda: 100.0, logging.getLogger("test"), scheduler=scheduler)
    loop.worker = Worker("ops")
    scheduler.at(t0 + 1.0, lambda: trail.append(("driver", clock.monotonic() - t0)))
    scheduler.at(t0 + 4.0, lambda: trail.append(("driver", clock.monotonic() - t0)))
    _run(scheduler, t0 + 10.0)

    assert trail == [
        ("step begins", 0.0),
        ("driver", 1.0),
        ("after the first wait", 2.0),
        ("driver", 4.0),
        ("step ends", 5.0),
    ]
    assert loop.result == "done" and loop.steps == 1 and not loop.running
    assert clock.driver_waits == 0  # both waits were the worker's, handed back to the schedule
    assert loop.due == 105.0 + t0  # the next step one interval after this one ended


def test_a_wait_on_the_driver_moves_the_clock_itself_and_is_counted():
    clock = VirtualClock(START)
    t0 = clock.monotonic()
    assert clock.wait(threading.Event(), 7.0) is False
    assert clock.monotonic() - t0 == 7.0 and clock.driver_waits == 1


def test_a_failing_worker_step_is_kept_as_the_loops_last_error_and_the_loop_goes_on():
    clock = VirtualClock(START)
    scheduler = Scheduler(clock)
    calls = []

    def step() -> None:
        calls.append(clock.monotonic())
        clock.sleep(1.0)
        if len(calls) == 1:
            raise RuntimeError("GKE said no")

    loop = ScheduledLoop("ops", step, lambda: 5.0, logging.getLogger("test"), scheduler=scheduler)
    loop.worker = Worker("ops")
    _run(scheduler, clock.monotonic() + 1.5)
    assert loop.last_error == "RuntimeError: GKE said no" and not loop.running
    _run(scheduler, clock.monotonic() + 10.0)
    assert len(calls) == 2 and loop.last_error == ""


def test_closing_a_parked_worker_finishes_its_step_with_waits_that_return_at_once():
    clock = VirtualClock(START)
    scheduler = Scheduler(clock)
    stop = threading.Event()
    ended = []

    def step() -> None:
        while not stop.is_set():
            if clock.wait(stop, 2.0):
                break
            if len(ended) > 100:
                return
            ended.append("polled")
        ended.append("ended")

    loop = ScheduledLoop("ops", step, lambda: 5.0, logging.getLogger("test"), scheduler=scheduler)
    loop.worker = Worker("ops")
    _run(scheduler, clock.monotonic() + 5.0)
    assert loop.worker.parked and ended == ["polled", "polled"]
    stop.set()
    loop.worker.close()
    assert ended[-1] == "ended" and not loop.worker.parked
