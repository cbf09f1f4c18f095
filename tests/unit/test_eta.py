"""The start estimate by itself (``reconcile.eta``): hand-overs and creates told apart in the
history, pools that come free foreseen, capacity-bound queues, too little history, and the
rounding to an absolute time that keeps a Message steady."""

from __future__ import annotations

import datetime as dt

import pytest

from falcon_ray import lifecycle as lc
from falcon_ray.lifecycle import LeaseState
from falcon_ray.model import Lease, QueueHistory, QueueTask, StartSample, TaskEvent
from falcon_ray.reconcile import eta
from falcon_ray.spec import SupplyMode, parse_spec

NOW = dt.datetime(2026, 12, 1, 12, 0, 0)
FLEX = SupplyMode.FLEX_START
RES = SupplyMode.RESERVATION


def task(tid: int, phase, age_s: float = 0.0, timeout: int = 1200, mode: str = "flex-start", actor: str = "alice") -> QueueTask:
    spec = parse_spec({"tpu_type": "v6e", "topology": "2x2", "image": "i:1", "command": ["r"],
                       "supply_mode": mode, "timeout_seconds": timeout})  # fmt: skip
    since = NOW - dt.timedelta(seconds=age_s)
    return QueueTask(tid, f"t{tid}", actor, phase, since, None, spec, None, None, "", phase_since=since)


def lease(lid: int, state: LeaseState, age_s: float, task_id: int | None = None, ready: bool = True, mode: SupplyMode = FLEX) -> Lease:
    at = NOW - dt.timedelta(seconds=age_s)
    return Lease(lid, "c", "2x2", f"p{lid}", mode, state, task_id, None, 0, "", at, at, at if ready else None, None, None)


def sample(i: int, acquire_s: float, handed: bool = False, busy_s: float = 0.0, ran_s: float | None = None,
           timeout: float = 1200, mode: SupplyMode = FLEX) -> StartSample:  # fmt: skip
    picked = NOW - dt.timedelta(hours=5 - i * 0.1)
    running = picked + dt.timedelta(seconds=acquire_s + busy_s)
    given = running - dt.timedelta(seconds=acquire_s) if handed else None
    return StartSample(100 + i, mode, picked, running, busy_s, timeout, ran_s, given)


def history(*samples: StartSample) -> QueueHistory:
    return QueueHistory(tuple(samples))


def creates(acquire_s: float, n: int = 3, ran_s: float | None = None, busy_s: float = 0.0, mode: SupplyMode = FLEX) -> list[StartSample]:
    return [sample(i, acquire_s, busy_s=busy_s, ran_s=ran_s, mode=mode) for i in range(n)]


def handovers(acquire_s: float, n: int = 3, ran_s: float | None = None) -> list[StartSample]:
    return [sample(10 + i, acquire_s, handed=True, ran_s=ran_s) for i in range(n)]


W2, W3 = task(2, lc.WAITING), task(3, lc.WAITING)
CASES = [
    pytest.param(  # acquisition-bound, nothing running: one create after another
        history(*creates(300)), [task(1, lc.PROVISIONING, age_s=100)], [], [W2, W3], eta.Pools(),
        {2: 500.0, 3: 800.0}, id="creates-one-after-another",
    ),
    pytest.param(  # hand-overs do not pull the create time down: the two modes are apart
        history(*creates(600), *handovers(20)), [], [], [W2, W3], eta.Pools(),
        {2: 600.0, 3: 1200.0}, id="bimodal-history-creates",
    ),
    pytest.param(  # an idle pool now: the first task takes it (a hand-over), the next creates
        history(*creates(600), *handovers(20)), [], [], [W2, W3], eta.Pools(idle=[lease(7, LeaseState.IDLE, 50)]),
        {2: 20.0, 3: 620.0}, id="idle-pool-handed-over",
    ),
    pytest.param(  # the same idle pool with its nodes gone is handed over cold: it comes when an
        # acquisition begun at its create would (600 - 50 s), not now; a flex-start pool's nodes
        # come after its create, so no create of task 2 goes on for task 3, which creates once
        # task 2 runs
        history(*creates(600), *handovers(20)), [], [], [W2, W3],
        eta.Pools(idle=[lease(7, LeaseState.IDLE, 50)], cold=frozenset({7})),
        {2: 550.0 + 20, 3: 570.0 + 600}, id="idle-pool-handed-over-cold",
    ),
    pytest.param(  # a reservation pool's create is most of its acquisition: one cut short by a
        # pool that comes free goes on and serves task 3
        history(*creates(600, mode=RES), *handovers(20)), [], [], [task(2, lc.WAITING, mode="reservation"), task(3, lc.WAITING, mode="reservation")],
        eta.Pools(idle=[lease(7, LeaseState.IDLE, 50, mode=RES)], cold=frozenset({7})),
        {2: 550.0 + 20, 3: 600.0 + 20}, id="idle-pool-handed-over-cold-reservation",
    ),
    pytest.param(  # a slot holder waiting for its new pool's nodes (600 s left) takes a pool
        # with Ready nodes only: the cold idle pool of its supply (its nodes in 400 s) is not
        # one; task 2, picked when the holder runs, takes it
        history(*creates(900, ran_s=600), *handovers(20, ran_s=600)), [task(1, lc.WAITING_FOR_NODE, age_s=300)], [], [W2],
        eta.Pools(idle=[lease(7, LeaseState.IDLE, 500)], held={1: lease(5, LeaseState.IN_USE, 300, task_id=1)}, cold=frozenset({7})),
        {2: 600.0 + 20}, id="holder-waiting-for-nodes-takes-no-cold-pool",
    ),
    pytest.param(  # a running task ends (600 s of its 1200 s timeout: 0.5) before a create would
        history(*creates(900, ran_s=600), *handovers(20, ran_s=600)), [], [task(9, lc.RUNNING, age_s=400)], [W2, W3],
        eta.Pools(), {2: 200.0 + 20, 3: 820.0 + 20}, id="running-task-hands-its-pool",  # 3: task 2's pool
    ),
    pytest.param(  # the holder creating switches to the running task's pool; its create serves task 2
        history(*creates(900, ran_s=600), *handovers(20, ran_s=600)), [task(1, lc.PROVISIONING, age_s=300)],
        [task(9, lc.RUNNING, age_s=400)], [W2], eta.Pools(held={1: lease(5, LeaseState.CREATING, 300, task_id=1, ready=False)}),
        {2: 600.0 + 20}, id="holder-switches-create-goes-on",
    ),
    pytest.param(  # the holder waiting for the nodes of its new pool takes the running task's pool
        # when it comes free (200 s), and its own pool goes: task 2 waits for the holder's run
        # (its mean, 600 s), not for the holder's pool (at 600 s)
        history(*creates(900, ran_s=600), *handovers(20, ran_s=600)), [task(1, lc.WAITING_FOR_NODE, age_s=300)],
        [task(9, lc.RUNNING, age_s=400)], [W2], eta.Pools(held={1: lease(5, LeaseState.IN_USE, 300, task_id=1)}),
        {2: 220.0 + 600 + 20}, id="holder-waiting-for-nodes-switches",
    ),
    pytest.param(  # the queue does not hand pools over: creates only
        history(*creates(900, ran_s=600)), [], [task(9, lc.RUNNING, age_s=400)], [W2], eta.Pools(handover=False),
        {2: 900.0}, id="no-handover-setting",
    ),
    pytest.param(  # capacity-bound, room seen to come in 400 s: the holder (50 s in ClusterBusy)
        # takes the running task's pool, free at 200 s, before room would come (350 s left and
        # a create); task 2 then waits for room and creates (400 + 30 s) before the holder's
        # run ends (its mean, 600 s)
        history(*creates(30, busy_s=400, ran_s=600)), [task(1, lc.CLUSTER_BUSY, age_s=50)],
        [task(9, lc.RUNNING, age_s=100, timeout=600)], [task(2, lc.WAITING, timeout=2000)], eta.Pools(),
        {2: 200 + 60 + 400 + 30}, id="capacity-bound-room-or-pools",  # no hand-over seen yet: 60 s
    ),
    pytest.param(  # capacity-bound, room seen to come in 2,000 s: the holder takes the running
        # task's pool, task 2 the holder's, each before room would come; no create of the holder
        # goes on (it asked for none)
        history(*creates(30, busy_s=2000, ran_s=600)), [task(1, lc.CLUSTER_BUSY, age_s=50)],
        [task(9, lc.RUNNING, age_s=100, timeout=600)], [task(2, lc.WAITING, timeout=2000)], eta.Pools(),
        {2: 200 + 60 + 600 + 60}, id="capacity-bound-waits-for-pools",
    ),
    pytest.param(  # capacity-bound, nothing running: the holder's room comes at the median of
        # the waits longer than its 300 s (500 and 900: 700), then it creates (30 s); task 2
        # waits for room from the holder's start (the median, 500 s) and creates, before the
        # holder's run ends (its mean, 600 s)
        history(sample(0, 30, busy_s=100, ran_s=600), sample(1, 30, busy_s=500, ran_s=600), sample(2, 30, busy_s=900, ran_s=600)),
        [task(1, lc.CLUSTER_BUSY, age_s=300)], [], [W2], eta.Pools(),
        {2: 400 + 30 + 500 + 30}, id="capacity-bound-room-comes",
    ),
    pytest.param(  # too little history
        history(*creates(300, n=2)), [], [], [W2], eta.Pools(), {}, id="two-starts-no-estimate",
    ),
    pytest.param(  # capacity-bound without ended runs: no basis
        history(*creates(30, busy_s=400)), [task(1, lc.CLUSTER_BUSY)], [], [W2], eta.Pools(), {}, id="bound-no-runs",
    ),
    pytest.param(  # only hand-overs seen, no pool to come free: no create time, no estimate
        history(*handovers(20)), [], [], [W2], eta.Pools(), {}, id="no-create-seen",
    ),
]


@pytest.mark.parametrize("hist, holders, running, waiting, pools, want", CASES)
def test_estimate(hist, holders, running, waiting, pools, want):
    assert eta.estimate(NOW, hist, holders, running, waiting, "", pools) == pytest.approx(want)


@pytest.mark.parametrize(
    "runs, age, want",
    [
        ([100, 200, 900], 0, 200),  # the median run
        ([100, 200, 900], 150, 550 - 150),  # the median of the runs longer than its age: 200, 900
        ([100, 200, 900], 1000, 1200 - 1000),  # longer than every run: its timeout
    ],
)
def test_a_running_task_is_expected_to_last_what_longer_runs_lasted(runs, age, want):
    m = eta.model_of(history(*[sample(i, 300, ran_s=r) for i, r in enumerate(runs)]))
    assert m is not None and m.runs().left(1200, age) == pytest.approx(want)


def test_a_runs_length_comes_from_the_ended_runs_with_the_nearest_timeouts():
    # short runs set short timeouts, long runs long ones; the slack is not proportional
    short = [sample(i, 300, ran_s=50, timeout=3700) for i in range(5)]
    long = [sample(10 + i, 300, ran_s=8000, timeout=20000) for i in range(5)]
    m = eta.model_of(history(*short, *long))
    assert m is not None and m.runs().left(20000) == pytest.approx(8000)  # all ten pooled: about 4,100
    assert m.runs().left(3700) == pytest.approx(50)


def test_a_neighbours_run_counts_as_the_same_share_of_the_timeout_once_the_margin_is_taken_out():
    # users set the timeout at twice the run plus an hour: the share of the timeout a run
    # lasts grows with the timeout (7% at 4,200 s, 33% at 10,800 s); (run + 1,800) / timeout does not
    rows = [(4200, 300), (5400, 900), (6600, 1500), (7800, 2100), (9000, 2700), (10800, 3600)]
    m = eta.model_of(history(*[sample(i, 300, ran_s=r, timeout=t) for i, (t, r) in enumerate(rows)]))
    assert m is not None
    runs = m.runs()
    assert runs.offset == pytest.approx(-1800)
    # between the runs seen and beyond them
    assert runs.left(6000) == pytest.approx(1200) and runs.mean(6000) == pytest.approx(1200)
    assert runs.left(12000) == pytest.approx(4200)
    # a run that failed early moves the line little (medians of the pairs' slopes and of the offsets)
    failed = sample(9, 300, ran_s=20, timeout=10200)
    m = eta.model_of(history(*[sample(i, 300, ran_s=r, timeout=t) for i, (t, r) in enumerate(rows)], failed))
    assert m is not None and m.runs().offset == pytest.approx(-1800, abs=150)


@pytest.mark.parametrize(
    "rows",
    [
        [(3600, 100), (3600, 900), (3700, 400)],  # every timeout the same (within 5%): nothing to learn from
        [(600, 290), (1800, 950), (600, 310), (1800, 850), (600, 300)],  # half the timeout, give or take: no margin
    ],
)
def test_without_a_margin_the_runs_explain_a_neighbour_counts_as_the_same_share(rows):
    m = eta.model_of(history(*[sample(i, 300, ran_s=r, timeout=t) for i, (t, r) in enumerate(rows)]))
    assert m is not None and m.runs().offset is None


def test_runs_still_going_count_as_at_least_as_long_as_they_have_lasted():
    # the queue's last starts: three short runs ended, four long ones still going after 1000 s
    ended = [sample(i, 300, ran_s=r) for i, r in enumerate([100, 200, 300])]
    going = [StartSample(200 + i, FLEX, NOW - dt.timedelta(seconds=1400), NOW - dt.timedelta(seconds=1000), 0.0, 1200) for i in range(4)]
    m = eta.model_of(history(*ended, *going))
    assert m is not None
    going_ids = [g.task_id for g in going]
    assert m.runs().left(1200) == pytest.approx(200)  # the ended runs alone: the short ones
    assert m.runs(NOW, going_ids).left(1200) == pytest.approx(1200)  # more than half run longer than 1000 s: the timeout
    assert m.runs(NOW, going_ids).left(1200, age=50) == pytest.approx(1150)
    # a start whose task no longer runs (aborted: the history has no end for it) is left out
    assert m.runs(NOW, going_ids[:1]).left(1200) == pytest.approx(250)


@pytest.mark.parametrize(
    "runs, age, left, mean",
    [
        # two ended (100 s, 200 s), one going at 500 s: half have ended by 200 s; past 200 s
        # the survivor's share stays 1/3 until the timeout
        ([(0.1, True), (0.2, True), (0.5, False)], 0, 200, 100 + 100 * 2 / 3 + 800 / 3),
        # aged 150 s: of the two runs longer, one ended at 200 s (the half): between it and the
        # next end, and there is none: 200 s
        ([(0.1, True), (0.2, True), (0.5, False)], 150, 50, None),
        # none ended: no basis, the timeout
        ([(0.3, False), (0.6, False)], 0, 1000, 1000),
        # an end and a censoring at one fraction: the end counts first (the other outlasted it),
        # so 2/3 outlast 200 s and the half is reached at the next end, 900 s
        ([(0.2, True), (0.2, False), (0.9, True)], 0, 900, 200 + 700 * 2 / 3),
    ],
)
def test_runs_left_and_mean_from_ended_and_censored_runs(runs, age, left, mean):
    r = eta.Runs(tuple((1000.0, f, ended) for f, ended in runs))
    assert r.left(1000.0, age) == pytest.approx(left)
    if mean is not None:
        assert r.mean(1000.0) == pytest.approx(mean)


def test_a_run_not_started_counts_its_mean_and_a_running_one_its_median_left():
    # heavy-tailed runs: the median is 100 s, the mean 700 s
    h = history(*[sample(i, 5000, ran_s=r, timeout=3000) for i, r in enumerate([100, 100, 100, 2500])])
    m = eta.model_of(h)
    assert m is not None and m.runs().mean(3000) == pytest.approx(700) and m.runs().left(3000) == pytest.approx(100)
    running = [task(9, lc.RUNNING, timeout=3000)]
    waiting = [task(2, lc.WAITING, timeout=3000), task(3, lc.WAITING, timeout=3000)]
    got = eta.estimate(NOW, h, [], running, waiting, "", eta.Pools())
    # task 2 takes the running task's pool when its median run ends (100 s, a hand-over of 60 s
    # more); task 3 takes it after task 2's run, whose length is not known yet: its mean
    assert got == {2: pytest.approx(160), 3: pytest.approx(160 + 700 + 60)}


def test_a_mode_with_few_creates_of_its_own_takes_them_before_other_modes():
    reservation = [sample(i, 600, mode=RES) for i in range(5)]
    h = history(*reservation, sample(9, 3000))  # one flex-start create: its capacity wait included
    assert eta.estimate(NOW, h, [], [], [W2], "", eta.Pools()) == {2: pytest.approx(3000)}  # pooled: 600


def test_a_create_that_outlasted_every_sample_takes_a_typical_create_more():
    holder = task(1, lc.PROVISIONING, age_s=2000)  # every create seen took 300 s
    got = eta.estimate(NOW, history(*creates(300)), [holder], [], [W2], "", eta.Pools())
    assert got == {2: pytest.approx(300 + 300)}  # not "now": it waits for capacity again


def cut(i: int, after_s: float, mode: SupplyMode = FLEX) -> StartSample:
    """A start whose own create was cut short ``after_s`` after its pick by a pool that came free."""
    picked = NOW - dt.timedelta(hours=4 - i * 0.1)
    given = picked + dt.timedelta(seconds=after_s)
    return StartSample(200 + i, mode, picked, given + dt.timedelta(seconds=20), 0.0, 1200, None, given)


def test_a_create_cut_short_by_a_hand_over_counts_as_lasting_longer():
    # creates ended at 500 s and 3,000 s (its capacity came); four were cut at 600-900 s by
    # pools that came free: they say those creates took longer than that (Kaplan-Meier: the
    # median is 3,000 s), neither 750 s (counted as ended) nor 1,750 s (left out)
    h = history(sample(0, 3000), sample(1, 500), *(cut(i, 600 + 100 * i) for i in range(4)), *handovers(20))
    assert eta.estimate(NOW, h, [], [], [W2], "", eta.Pools()) == {2: pytest.approx(3000)}
    holder = task(1, lc.PROVISIONING, age_s=1000)  # a create under way for 1,000 s: 2,000 s more
    got = eta.estimate(NOW, h, [holder], [], [W2], "", eta.Pools(held={1: lease(5, LeaseState.CREATING, 1000, task_id=1, ready=False)}))
    assert got == {2: pytest.approx(2000 + 3000)}


def test_creates_all_cut_short_take_the_longest_seen():
    # no flex-start create ended: all modes' creates, three reservation ones of 300 s and four
    # flex-start ones cut at 600-900 s, whose median lies past every end seen: the longest
    # seen (not 300 s, as if the cut ones said nothing)
    h = history(*(sample(i, 300, mode=RES) for i in range(3)), *(cut(i, 600 + 100 * i) for i in range(4)))
    assert eta.estimate(NOW, h, [], [], [W2], "", eta.Pools()) == {2: pytest.approx(900)}


W, P, B, N, D, R = ("Pending", "Waiting"), ("Pending", "Provisioning"), ("Pending", "ClusterBusy"), \
    ("Pending", "WaitingForNode"), ("Pending", "Dispatching"), ("Running", "")  # fmt: skip


@pytest.mark.parametrize(
    "steps, times, mode, handed, acquire, handover, create",
    [
        ([W, D, R], [0, 100, 130], RES, True, 30, 30, None),  # picked with an idle pool there
        # ... one the autoscaler had emptied: its nodes came for its Job, an acquisition
        ([W, D, N, R], [0, 100, 110, 190], RES, False, 90, 0, (90, True)),
        ([W, P, N, D, R], [0, 100, 500, 560, 590], RES, False, 490, 0, (490, True)),  # its own create: nodes register
        ([W, P, N, R], [0, 100, 500, 800], FLEX, False, 700, 0, (700, True)),  # its own flex-start create: Job first, nodes after
        # switched to a pool that came free: its create, cut at 200 s, would have lasted longer
        ([W, P, D, R], [0, 100, 300, 320], RES, True, 220, 20, (200, False)),
        ([W, B, D, R], [0, 100, 700, 720], RES, True, 20, 20, (0, False)),  # a capacity wait a pool that came free ended
        # a flex-start pool's nodes come for the Job (WaitingForNode -> Running): a Dispatching
        # after WaitingForNode is a pool with Ready nodes taken instead of its own
        ([W, P, N, D, R], [0, 100, 700, 2000, 2020], FLEX, True, 1920, 20, (1900, False)),
        # given a pool without nodes, waited for them, then took one whose nodes were Ready
        ([W, P, D, N, D, R], [0, 100, 200, 200, 1500, 1520], RES, True, 1420, 20, (1400, False)),
        ([W, P, D, N, R], [0, 100, 200, 200, 1500], FLEX, False, 1400, 0, (1400, True)),  # took over a create, waited for it
    ],
)
def test_sample_tells_a_hand_over_from_a_create(steps, times, mode, handed, acquire, handover, create):
    events = [TaskEvent(1, NOW + dt.timedelta(seconds=x), st, rs, "") for x, (st, rs) in zip(times, steps, strict=True)]
    s = eta.sample_from_events(1, events, mode, 1200)
    assert s is not None and (s.handed_over, s.acquire_s, s.handover_s, s.create_seen) == (handed, acquire, handover, create)


def test_sample_from_events_leaves_out_the_capacity_wait():
    at = [NOW + dt.timedelta(seconds=s) for s in (0, 10, 20, 620, 650, 1250)]
    steps = [("Pending", ""), ("Pending", "Waiting"), ("Pending", "ClusterBusy"), ("Pending", "Dispatching"),
             ("Running", ""), ("Succeeded", "")]  # fmt: skip
    events = [TaskEvent(1, a, st, rs, "") for a, (st, rs) in zip(at, steps, strict=True)]
    s = eta.sample_from_events(1, events, SupplyMode.RESERVATION, 1200)
    assert s is not None and s.capacity_wait_s == 600 and s.acquire_s == 30 and s.ran_s == 600 and s.handover_s == 30


@pytest.mark.parametrize(
    "seconds, want",
    [
        (20, ("12:00", "12:01")),  # 1 minute steps below 10 minutes
        (100, ("12:02", "12:01")),
        (1420, ("12:25", "12:20")),  # 5 minute steps below 2 hours
        (8000, ("14:00", "14:30")),  # 30 minute steps beyond
    ],
)
def test_rounding_to_an_absolute_time_offers_both_neighbours_nearest_first(seconds, want):
    got = eta.choices(NOW, seconds)
    assert tuple(eta.fmt_at(x) for x in got) == tuple(f"2026-12-01 {w}" for w in want)


def test_a_steady_estimate_keeps_its_time_as_the_clock_moves():
    start = NOW + dt.timedelta(seconds=3000)
    shown = eta.choices(NOW, 3000)[0]
    for minutes in range(0, 40, 3):
        later = NOW + dt.timedelta(minutes=minutes)
        assert shown in eta.choices(later, (start - later).total_seconds())


def test_a_historys_model_is_worked_out_once_and_a_new_history_gets_its_own():
    h = history(*creates(300))
    m = eta.model_of(h)
    assert eta.model_of(h) is m  # the same value: the step's rounds and Messages share it
    longer = history(*creates(900))
    assert eta.model_of(longer).create(FLEX) == pytest.approx(900) and eta.model_of(h).create(FLEX) == pytest.approx(300)
    for i in range(2 * eta._MODELS_KEPT):  # the memo is bounded and stays right past its bound
        assert eta.model_of(history(*creates(100 + i))).create(FLEX) == pytest.approx(100 + i)
    assert len(eta._MODELS) <= eta._MODELS_KEPT


# ---- the range ------------------------------------------------------------------------------------



def test_a_score_is_the_lateness_over_the_expected_wait_plus_the_scale():
    assert eta.score(600, 900) == pytest.approx(300 / (600 + eta.SCALE_S))
    assert eta.score(0, 0) == 0 and eta.score(600, 300) < 0  # early: negative


def test_the_latest_start_is_the_conformal_quantile_of_the_modes_scores():
    scores = tuple((RES, i / 20) for i in range(20))  # 0.00 .. 0.95
    h = QueueHistory(tuple(creates(300)), scores)
    r2, r3 = task(2, lc.WAITING, mode="reservation"), task(3, lc.WAITING, mode="reservation")
    got = eta.ranges(NOW, h, [], [], [r2, r3], "", eta.Pools())
    q = 0.9  # the ceil(21 * 0.9) = 19th smallest of 20
    assert got[2] == eta.Range(300.0, pytest.approx(300 + q * (300 + eta.SCALE_S)), RES)
    assert got[3].expected == 600 and got[3].latest == pytest.approx(600 + q * (600 + eta.SCALE_S))


def test_a_flex_start_latest_start_is_never_less_than_twice_the_expected_wait():
    # its recent estimates were all close (scores of 0.0 .. 0.5): the quantile alone would
    # promise 1.45 times the wait; a flex-start start waits for capacity with no promised time
    scores = tuple((FLEX, i / 40) for i in range(20))
    h = QueueHistory(tuple(creates(300)), scores)
    got = eta.ranges(NOW, h, [], [], [W2], "", eta.Pools())
    assert got[2].latest == pytest.approx(300 + eta.MIN_BOUNDS[FLEX] * (300 + eta.SCALE_S))
    wide = QueueHistory(tuple(creates(300)), tuple((FLEX, i / 5) for i in range(20)))  # up to 3.8
    assert eta.ranges(NOW, wide, [], [], [W2], "", eta.Pools())[2].latest == pytest.approx(300 + 3.6 * 600)


def test_a_mode_with_few_scores_takes_the_prior_or_the_queues_wider_quantile():
    few = QueueHistory(tuple(creates(300)), tuple((RES, 0.1) for _ in range(eta.MIN_SCORES)))
    got = eta.ranges(NOW, few, [], [], [W2], "", eta.Pools())  # W2 is flex-start: none of its own
    assert got[2].latest == pytest.approx(300 + eta.PRIOR_SCORES[FLEX] * (300 + eta.SCALE_S))
    wide = QueueHistory(tuple(creates(300)), tuple((RES, 5.0) for _ in range(eta.MIN_SCORES)))
    assert eta.ranges(NOW, wide, [], [], [W2], "", eta.Pools())[2].latest == pytest.approx(300 + 5.0 * 600)
    # its own scores, once it has enough, however narrow (a flex-start task's down to its floor)
    own = QueueHistory(tuple(creates(300)), tuple((m, 0.0) for m in (FLEX, RES) for _ in range(eta.MIN_SCORES)))
    assert eta.ranges(NOW, own, [], [], [W2], "", eta.Pools())[2].latest == pytest.approx(300 + eta.MIN_BOUNDS[FLEX] * 600)
    res = task(2, lc.WAITING, mode="reservation")
    assert eta.ranges(NOW, own, [], [], [res], "", eta.Pools())[2].latest == pytest.approx(300)


def test_a_reservation_task_behind_a_flex_start_acquisition_shares_its_floor():
    # the reservation tasks' recent estimates were exact (scores 0): alone in the queue, the
    # latest start is the expected one; behind a flex-start holder or a flex-start task ahead
    # (one slot) it waits for that capacity too, and its latest start is at least twice its wait
    own = QueueHistory(tuple(creates(300)), tuple((m, 0.0) for m in (FLEX, RES) for _ in range(eta.MIN_SCORES)))
    r2, r3 = task(2, lc.WAITING, mode="reservation"), task(3, lc.WAITING, mode="reservation")
    alone = eta.ranges(NOW, own, [], [], [r2, r3], "", eta.Pools())
    assert (alone[2].latest, alone[3].latest) == (alone[2].expected, alone[3].expected)
    holder = task(1, lc.PROVISIONING, age_s=100)  # flex-start
    behind = eta.ranges(NOW, own, [holder], [], [r2], "", eta.Pools())
    assert behind[2].latest == pytest.approx(behind[2].expected + eta.MIN_BOUNDS[FLEX] * (behind[2].expected + eta.SCALE_S))
    after = eta.ranges(NOW, own, [], [], [r2, W3, r3], "", eta.Pools())  # W3 is flex-start
    assert after[2].latest == after[2].expected
    assert after[3].latest == pytest.approx(after[3].expected + eta.MIN_BOUNDS[FLEX] * (after[3].expected + eta.SCALE_S))
    # a slot per supply: a reservation task does not wait behind a flex-start create
    per = eta.ranges(NOW, own, [holder], [], [r2], "", eta.Pools(), per_supply=True)
    assert per[2].latest == per[2].expected


def test_a_flex_start_task_without_scores_of_its_mode_gets_a_wider_prior_than_a_reservation_task():
    h = QueueHistory(tuple(creates(300)), ())
    res = task(2, lc.WAITING, mode="reservation")
    assert eta.ranges(NOW, h, [], [], [res], "", eta.Pools())[2].latest == pytest.approx(300 + eta.PRIOR_SCORE * 600)
    assert eta.ranges(NOW, h, [], [], [W2], "", eta.Pools())[2].latest == pytest.approx(300 + 3.5 * 600)


def test_no_range_without_an_estimate():
    assert eta.ranges(NOW, history(*creates(300, n=2)), [], [], [W2], "", eta.Pools()) == {}


@pytest.mark.parametrize(
    "seconds, width, want",
    [
        (1420, 3000, ("12:25", "12:30", "12:35", "12:40", "12:45", "12:50", "12:55")),  # rounded up, then up to 6 steps later
        (1500, 3000, ("12:25", "12:30", "12:35", "12:40", "12:45", "12:50", "12:55")),  # on a step: itself
        (1420, 200, ("12:24", "12:25", "12:26", "12:27", "12:28", "12:29", "12:30")),  # no coarser than the range is wide
        (8000, 1000, ("14:15", "14:20", "14:25", "14:30", "14:35", "14:40", "14:45")),
    ],
)
def test_the_latest_start_is_rounded_up(seconds, width, want):
    got = eta.latest_choices(NOW, seconds, width)
    assert tuple(x.strftime("%H:%M") for x in got) == want


def test_the_latest_start_shows_its_date_only_on_another_day():
    e = dt.datetime(2026, 12, 1, 23, 30)
    assert eta.fmt_latest(e, dt.datetime(2026, 12, 1, 23, 55)) == "23:55"
    assert eta.fmt_latest(e, dt.datetime(2026, 12, 2, 0, 30)) == "2026-12-02 00:30"


def test_with_a_slot_per_supply_a_task_waits_only_for_its_own_supplys_holder_and_tasks():
    """A reservation task waits for room (ClusterBusy): the flex-start tasks behind it create
    one after another from now; the reservation task behind it counts on pools that come
    free only (none here: no estimate). With one slot for the queue, nobody has a basis."""
    hist = history(*creates(300))
    holder = task(1, lc.CLUSTER_BUSY, age_s=50, mode="reservation")
    res_waiting = task(4, lc.WAITING, mode="reservation")
    waiting = [W2, res_waiting, W3]
    assert eta.estimate(NOW, hist, [holder], [], waiting, "", eta.Pools(), per_supply=True) == pytest.approx({2: 300.0, 3: 600.0})
    assert eta.estimate(NOW, hist, [holder], [], waiting, "", eta.Pools()) == {}
    # a flex-start holder creating: the reservation task does not wait for it
    creating = task(1, lc.PROVISIONING, age_s=100)
    got = eta.estimate(NOW, history(*creates(300), *[sample(20 + i, 200, mode=RES) for i in range(3)]), [creating], [],
                       [W2, res_waiting], "", eta.Pools(), per_supply=True)  # fmt: skip
    assert got == pytest.approx({2: 500.0, 4: 200.0})


def test_room_is_expected_after_the_waits_for_capacity_seen_then_a_create():
    """``Model.after_busy``: what is left of the queue's waits for capacity (ClusterBusy) longer
    than the time spent, then a create; past every wait seen, twice the longest, doubled until
    past the time spent, so the expected start stays put while the wait goes on."""
    m = eta.model_of(history(sample(0, 30, busy_s=100, ran_s=600), sample(1, 30, busy_s=500, ran_s=600), sample(2, 30, busy_s=900, ran_s=600)))
    assert m is not None
    assert m.after_busy(FLEX) == pytest.approx(500 + 30)
    assert m.after_busy(FLEX, 300) == pytest.approx(700 - 300 + 30)
    assert m.after_busy(FLEX, 1000) == pytest.approx(1800 - 1000 + 30)
    # the same expected start (the wait's start + 3,600 s + a create) from 2,000 s to 3,500 s
    assert [spent + m.after_busy(FLEX, spent) for spent in (2000, 2700, 3500)] == pytest.approx([3630] * 3)
    assert eta.model_of(history(*creates(30, ran_s=600))).after_busy(FLEX) is None  # no wait for capacity seen


def test_a_holder_on_a_pool_it_took_over_waits_for_that_pool_s_supply():
    """A reservation task given an emptied flex-start pool (its task aborted while it waited
    for capacity) waits for flex-start capacity: its create is counted at the flex-start
    creates' length (3,000 s, 300 s spent), not the reservation's (200 s), and the task
    behind it gets the flex-start floor under its bound."""
    hist = history(*creates(200, mode=RES), *[sample(10 + i, 3000) for i in range(3)])
    holder = task(1, lc.WAITING_FOR_NODE, age_s=100, mode="reservation")
    taken = lease(5, LeaseState.IN_USE, 300, task_id=1)  # flex-start, created 300 s ago by the aborted task
    behind = task(2, lc.WAITING, mode="reservation")
    pools = eta.Pools(held={1: taken})
    assert eta.estimate(NOW, hist, [holder], [], [behind], "", pools) == pytest.approx({2: 2700.0 + 200})
    got = eta.ranges(NOW, hist, [holder], [], [behind], "", pools)[2]
    assert got.latest >= 2900.0 + eta.MIN_BOUNDS[FLEX] * (2900.0 + eta.SCALE_S)


def test_a_queue_whose_waits_for_room_ended_in_its_own_pools_counts_on_its_pools_only():
    """Waits in ClusterBusy that ended in a pool of the queue handed over say room never came
    from elsewhere (a queue alone on its reservation): the holder and the task behind wait
    for the queue's own pools, as before; one wait that ended in room makes room expected
    (Kaplan-Meier over the others, censored)."""
    alone = history(*[sample(i, 30, handed=True, busy_s=400, ran_s=600) for i in range(3)], *creates(30, ran_s=600))
    m = eta.model_of(alone)
    assert m is not None and m.after_busy(FLEX) is None
    holder, running = task(1, lc.CLUSTER_BUSY, age_s=50), task(9, lc.RUNNING, age_s=100, timeout=600)
    got = eta.estimate(NOW, alone, [holder], [running], [task(2, lc.WAITING, timeout=2000)], "", eta.Pools())
    assert got == pytest.approx({2: 200 + 30 + 600 + 30})  # the running task's pool, then the holder's
    mixed = history(*[sample(i, 30, handed=True, busy_s=400, ran_s=600) for i in range(2)], sample(5, 30, busy_s=900, ran_s=600))
    assert eta.model_of(mixed).after_busy(FLEX) == pytest.approx(900 + 30)


def arrived(*actors: str, over_s: float = 1800.0) -> tuple[tuple[dt.datetime, str], ...]:
    """Arrivals of ``actors`` spread evenly over the last ``over_s`` seconds, oldest first."""
    return tuple((NOW - dt.timedelta(seconds=over_s * (len(actors) - i) / len(actors)), a) for i, a in enumerate(actors))


def test_a_task_behind_its_own_actors_is_overtaken_by_another_actors_arrival():
    # the slot frees at 200 s, then every create takes 300 s; others arrive at 5 per 1,800 s:
    # 0.56 expected by 200 s (none foreseen), 1.39 by 500 s, when task 3 would follow
    # task 2 of its own actor: an overtaker of another actor takes that slot first
    holder = task(1, lc.PROVISIONING, age_s=100)
    queue = [task(2, lc.WAITING), task(3, lc.WAITING)]
    h = QueueHistory(tuple(creates(300)), (), arrived(*["alice", "bob"] * 5))
    assert eta.estimate(NOW, h, [holder], [], queue, "", last_granted="alice") == {2: 500.0, 3: 1100.0}
    # without arrivals of other actors, or with too few arrivals, none is foreseen
    alone = QueueHistory(tuple(creates(300)), (), arrived(*["alice"] * 10))
    assert eta.estimate(NOW, alone, [holder], [], queue, "", last_granted="alice") == {2: 500.0, 3: 800.0}
    few = QueueHistory(tuple(creates(300)), (), arrived("bob", "carol", "dave", "erin"))
    assert eta.estimate(NOW, few, [holder], [], queue, "", last_granted="alice") == {2: 500.0, 3: 800.0}


def test_a_task_the_round_robin_serves_next_is_not_overtaken():
    # bob's task follows alice's: the pick rule gives it the slot before any newcomer
    holder = task(1, lc.PROVISIONING, age_s=100)
    queue = [task(2, lc.WAITING), task(3, lc.WAITING, actor="bob"), task(4, lc.WAITING, actor="bob")]
    h = QueueHistory(tuple(creates(300)), (), arrived(*["alice", "carol"] * 5))
    # task 4 follows bob's task 3 at 800 s: a newcomer of another actor (2.2 expected) goes first
    assert eta.estimate(NOW, h, [holder], [], queue, "", last_granted="alice") == {2: 500.0, 3: 800.0, 4: 1400.0}
    # one overtaker foreseen is one arrival used: at 3 per 2,000 s (others: 1.5 per 1,000 s), 0.75
    # are expected by 500 s (one foreseen), 1.65 by 1,100 s (0.65 more: none), 2.1 by 1,400 s
    many = [task(2 + i, lc.WAITING) for i in range(4)]
    slower = QueueHistory(tuple(creates(300)), (), arrived(*["alice", "carol"] * 5, over_s=10000 / 3))
    got = eta.estimate(NOW, slower, [holder], [], many, "", last_granted="alice")
    assert got == {2: 500.0, 3: 1100.0, 4: 1400.0, 5: 2000.0}
