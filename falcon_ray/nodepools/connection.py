"""When the gateway tries again after a failed connect to its edge cluster.

Contract
--------
``connect_retry_delay_s(failures, jitter)``: the seconds before the next connect attempt
after ``failures`` failed ones in a row (at least 1). The delay doubles from
``CONNECT_BACKOFF_INITIAL_S`` with every failure up to ``CONNECT_BACKOFF_MAX_S``; the
caller's ``jitter`` (drawn in [0, 1)) adds up to a second, so that the gateways of many
clusters that lost the same endpoint do not all try again at the same moment.
"""

from __future__ import annotations

CONNECT_BACKOFF_INITIAL_S = 1.0
CONNECT_BACKOFF_MAX_S = 60.0


def connect_retry_delay_s(failures: int, jitter: float, max_s: float = CONNECT_BACKOFF_MAX_S) -> float:
    """Seconds to wait before the attempt after ``failures`` failed ones."""
    return min(CONNECT_BACKOFF_INITIAL_S * 2.0 ** (failures - 1), max_s) + jitter
