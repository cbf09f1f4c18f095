"""The connect backoff, table-driven: failed attempts in a row and the drawn jitter in, the
delay before the next attempt out."""

from __future__ import annotations

import pytest

from falcon_ray.nodepools.connection import CONNECT_BACKOFF_MAX_S, connect_retry_delay_s

DELAYS = [
    # (situation, failures in a row, jitter, seconds before the next attempt)
    ("first failure, no jitter", 1, 0.0, 1.0),
    ("first failure, some jitter", 1, 0.5, 1.5),
    ("second failure doubles", 2, 0.0, 2.0),
    ("fifth failure", 5, 0.25, 16.25),
    ("the delay stops doubling at the maximum", 7, 0.0, CONNECT_BACKOFF_MAX_S),
    ("long after: the maximum plus jitter", 40, 0.75, CONNECT_BACKOFF_MAX_S + 0.75),
]


@pytest.mark.parametrize(("situation", "failures", "jitter", "delay"), DELAYS, ids=[d[0] for d in DELAYS])
def test_connect_retry_delay(situation, failures, jitter, delay):
    assert connect_retry_delay_s(failures, jitter) == delay


def test_a_lower_maximum_caps_the_delay():
    assert connect_retry_delay_s(10, 0.0, max_s=5.0) == 5.0
