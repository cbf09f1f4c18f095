"""A QueueReconciler with ``read_every_step`` False (the QueueActor's setting, issue 25)
reads its rows only when they may have changed under it: after ``rows_changed()``, after a
lost write, and at least every ``queue_full_read_s``; other steps decide on the rows as kept.

A QueueReconciler on SQLite with a fake port and clock, as in test_queue_reads."""

from __future__ import annotations

from falcon_ray import lifecycle as lc
from tests.harness.fakes import QueueBench


class Reads:
    def __init__(self, bench: QueueBench) -> None:
        self.n = 0
        inner = bench.store.queue_snapshot

        def counted(*a, **kw):
            self.n += 1
            return inner(*a, **kw)

        bench.store.queue_snapshot = counted  # type: ignore[method-assign]


def hinted_bench(tmp_path, full_read_s: float = 3600) -> QueueBench:
    bench = QueueBench(f"sqlite:///{tmp_path / 'q.db'}", queue_full_read_s=full_read_s)
    bench.queue.read_every_step = False
    return bench


def live_ids(bench: QueueBench) -> set[int]:
    st = bench.queue.last_state
    return {t.id for t in st.tasks} if st else set()


def test_a_step_without_a_rows_hint_reads_no_rows(tmp_path):
    bench = hinted_bench(tmp_path)
    bench.submit("alice")
    bench.submit("bob")
    bench.step()
    reads = Reads(bench)
    for _ in range(3):
        bench.step(advance=0.5)
    assert reads.n == 0


def test_an_abort_and_a_new_task_are_read_after_the_rows_hint(tmp_path):
    bench = hinted_bench(tmp_path)
    holder = bench.submit("alice")
    bench.submit("bob")
    bench.step()
    assert bench.phase(holder) == str(lc.PROVISIONING)
    assert bench.store.request_abort(holder)
    late = bench.submit("carol")  # its poll leaves the slot holder's abort to the queue
    bench.step(advance=0.5)
    assert late not in live_ids(bench) and bench.task(holder).status == lc.Status.ABORTING  # no hint: not read
    bench.queue.rows_changed()  # the poller's hint
    bench.step(advance=0.5)
    assert late in live_ids(bench)
    assert bench.task(holder).status == lc.Status.ABORTED


def test_without_a_hint_the_rows_are_read_again_after_queue_full_read_s(tmp_path):
    bench = hinted_bench(tmp_path, full_read_s=0.3)
    bench.submit("alice")
    bench.step()
    late = bench.submit("carol")
    bench.step(advance=0.2)
    assert late not in live_ids(bench)  # no hint, and the last full read is younger than 0.3 s
    bench.step(advance=0.1)  # the periodic full read bounds what a lost hint costs
    assert late in live_ids(bench)


def test_a_lost_write_makes_the_next_step_read(tmp_path):
    bench = hinted_bench(tmp_path)
    bench.submit("alice")
    bench.step()
    bench.queue.mirror.must_read = True  # what a lost compare-and-set or a failed effect sets
    reads = Reads(bench)
    bench.step(advance=0.5)
    assert reads.n == 1
    bench.step(advance=0.5)
    assert reads.n == 1
