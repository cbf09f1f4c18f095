"""Cloud and cluster failures, mapped once into the few kinds the controller decides on.

Contract
--------
``classify(exc)`` turns anything the GKE, Compute or Kubernetes clients (or their
transports, or google-auth) can raise -- and the ``google.rpc.Status`` carried by a DONE
operation -- into a :class:`CloudError`. It never raises. The adapters in ``gcp`` and
``kube`` raise nothing but ``CloudError``; the controller branches on ``.kind`` only and
shows ``.message`` to users, so decisions never depend on client exception classes.

``CloudError.message`` is the API's own text (the Kubernetes ``Status.message``, the
Google ``error.message``, the operation's ``error.message``) without the client's
``"POST http://...: "`` prefix; quota and stockout texts are kept verbatim because they
are what an operator needs to see.

Kinds
-----
NOT_FOUND, ALREADY_EXISTS
    Outcomes more than failures; callers usually turn them into ``None`` or "adopt".
INCOMPATIBLE_OPERATION
    GKE refused because another operation runs on the cluster or pool ("is currently
    creating/deleting ...", "incompatible operation", "Please wait and try again"). It
    arrives as HTTP 400 FAILED_PRECONDITION (``BadRequest``, not ``FailedPrecondition``),
    so the text decides. Retry later; nothing was done.
TOO_MANY_OPERATIONS
    429 and rate-limit texts. Retry later; nothing was done.
STOCKOUT
    No capacity right now: ZONE_RESOURCE_POOL_EXHAUSTED (and ``..._WITH_DETAILS``),
    GCE_STOCKOUT, "resource pool exhausted", "does not have enough resources available",
    a reservation that is short, and a DONE operation with code 8 RESOURCE_EXHAUSTED
    that names no quota. Capacity comes back: the create is not retried by the clients,
    the QueueActor waits (ClusterBusy) and asks again with backoff.
QUOTA_EXCEEDED
    A quota is used up (QUOTA_EXCEEDED, "Quota '...' exceeded", "Insufficient ... quota",
    a Kubernetes ResourceQuota). Waiting does not lift a quota: the task fails
    (NodePoolFailed, the original's failure table); not retried by the clients.
TRANSIENT
    5xx, timeouts, connection errors, token refresh that failed in transport, 410 Gone,
    optimistic-concurrency 409s, and 401: the Kubernetes adapter forces a token refresh on
    a 401 before retrying, so a 401 that survives is reported, retried with backoff and
    visible in logs rather than failing a user's task on an auth glitch.
PERMANENT
    Every other 4xx (403, 400 invalid, 422, admission webhook denials), unknown
    exception types (bugs are not retried forever), and credentials that cannot be found.

``.retryable`` is true for TRANSIENT, TOO_MANY_OPERATIONS and INCOMPATIBLE_OPERATION.
"""

from __future__ import annotations

import json
import re
from typing import Any

import requests
import urllib3
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exc
from google.rpc import status_pb2
from kubernetes.client.exceptions import ApiException

from falcon_ray.model import RETRYABLE_KINDS, ErrorKind  # the vocabulary's one home


class CloudError(Exception):
    """One failure of a cloud or cluster call, in the controller's vocabulary.

    ``status_code`` is the HTTP status (for operation errors: the HTTP equivalent of the
    RPC code), or None when no response arrived. ``reason`` is the machine-readable
    detail when the API gave one (Google ``ErrorInfo.reason`` or status string,
    Kubernetes ``Status.reason``, RPC code name); it is for logs, never for decisions.
    """

    def __init__(
        self, kind: ErrorKind | str, message: str, status_code: int | None = None, reason: str = ""
    ) -> None:
        super().__init__(message)
        self.kind = ErrorKind(kind)
        self.message = message
        self.status_code = status_code
        self.reason = reason

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE_KINDS

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return (
            f"CloudError(kind={self.kind.value!r}, status_code={self.status_code!r}, "
            f"reason={self.reason!r}, message={self.message!r})"
        )

    def __reduce__(self):  # picklable across Ray processes
        return (CloudError, (self.kind.value, self.message, self.status_code, self.reason))


# --- text rules --------------------------------------------------------------------------
# The HTTP status alone cannot tell a stockout from a rate limit (both may be 429 or 403)
# nor an incompatible operation from a malformed request (both 400), so these decide.

_RATE_LIMIT = re.compile(
    r"RATE_LIMIT_EXCEEDED|rate limit|too many (operations|requests)"
    r"|per (second|minute|100 seconds|hour)\b|requests per",
    re.IGNORECASE,
)
# Checked first: a text that names a quota is about the quota, whatever else it says.
_QUOTA = re.compile(
    r"QUOTA_EXCEEDED|quota\b.*\bexceeded|exceeded\b.*\bquota|insufficient\b.*\bquota",
    re.IGNORECASE | re.DOTALL,
)
_STOCKOUT = re.compile(
    r"ZONE_RESOURCE_POOL_EXHAUSTED|RESOURCE_POOL_EXHAUSTED|resource pool exhausted|GCE_STOCKOUT|stock-?out"
    r"|does not have enough resources|not enough resources available|insufficient capacity"
    r"|reservation\b.*\b(exhausted|insufficient|not enough|no (remaining|available) capacity)",
    re.IGNORECASE | re.DOTALL,
)
_INCOMPATIBLE_OPERATION = re.compile(
    r"incompatible operation|please wait and try again"
    r"|is currently (creating|deleting|updating|upgrading|repairing|reconciling|resizing|being)\b"
    r"|operation \S+ is (already )?(running|in progress)|another operation is (running|in progress)",
    re.IGNORECASE,
)
_CLIENT_PREFIX = re.compile(r"^(GET|POST|PUT|PATCH|DELETE|HEAD) \S+: ")

# google.rpc.Code -> (name, HTTP equivalent), as in google/rpc/code.proto.
_RPC_CODES: dict[int, tuple[str, int]] = {
    1: ("CANCELLED", 499),
    2: ("UNKNOWN", 500),
    3: ("INVALID_ARGUMENT", 400),
    4: ("DEADLINE_EXCEEDED", 504),
    5: ("NOT_FOUND", 404),
    6: ("ALREADY_EXISTS", 409),
    7: ("PERMISSION_DENIED", 403),
    8: ("RESOURCE_EXHAUSTED", 429),
    9: ("FAILED_PRECONDITION", 400),
    10: ("ABORTED", 409),
    11: ("OUT_OF_RANGE", 400),
    12: ("UNIMPLEMENTED", 501),
    13: ("INTERNAL", 500),
    14: ("UNAVAILABLE", 503),
    15: ("DATA_LOSS", 500),
    16: ("UNAUTHENTICATED", 401),
}
_RPC_TRANSIENT = {
    "CANCELLED",
    "UNKNOWN",
    "DEADLINE_EXCEEDED",
    "ABORTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
}


def capacity_kind(text: str) -> ErrorKind | None:
    """QUOTA_EXCEEDED or STOCKOUT when the API's text says so, else None (also for a
    pool's ``statusMessage``, which carries the reason a pool is in ERROR)."""
    if _QUOTA.search(text):
        return ErrorKind.QUOTA_EXCEEDED
    if _STOCKOUT.search(text):
        return ErrorKind.STOCKOUT
    return None


def _kind_from_text_and_status(status_code: int | None, text: str, status_name: str = "") -> ErrorKind:
    """The shared decision for an HTTP-ish failure: status code plus the API's text."""
    if status_code == 404:
        return ErrorKind.NOT_FOUND
    if _RATE_LIMIT.search(text):
        return ErrorKind.TOO_MANY_OPERATIONS
    capacity = capacity_kind(text)
    if capacity is not None:
        return capacity
    if status_code == 429:
        return ErrorKind.TOO_MANY_OPERATIONS
    if status_code is not None and 400 <= status_code < 500 and _INCOMPATIBLE_OPERATION.search(text):
        return ErrorKind.INCOMPATIBLE_OPERATION
    if status_code == 409:
        return ErrorKind.TRANSIENT if status_name in {"ABORTED", "Conflict"} else ErrorKind.ALREADY_EXISTS
    if status_code in (401, 408, 410) or status_code is None or status_code >= 500:
        return ErrorKind.TRANSIENT
    return ErrorKind.PERMANENT


def from_rpc_status(code: int, message: str) -> CloudError:
    """A failed long-running operation (``Operation.error``: a google.rpc.Status)."""
    name, http = _RPC_CODES.get(code, ("UNKNOWN", 500))
    capacity = capacity_kind(message)
    if capacity is not None:
        kind = capacity
    elif name == "RESOURCE_EXHAUSTED":  # a failed operation's code 8 naming no quota: no capacity now
        kind = ErrorKind.STOCKOUT
    elif name == "NOT_FOUND":
        kind = ErrorKind.NOT_FOUND
    elif name == "ALREADY_EXISTS":
        kind = ErrorKind.ALREADY_EXISTS
    elif _INCOMPATIBLE_OPERATION.search(message) and name in {"FAILED_PRECONDITION", "ABORTED"}:
        kind = ErrorKind.INCOMPATIBLE_OPERATION
    elif name in _RPC_TRANSIENT:
        kind = ErrorKind.TRANSIENT
    else:
        kind = ErrorKind.PERMANENT
    return CloudError(kind, message or name, http, name)


def _google_call_error(exc: gexc.GoogleAPICallError) -> CloudError:
    message, status_name = "", ""
    response = getattr(exc, "response", None)
    if response is not None:
        try:
            payload = response.json()
            error = payload.get("error", {}) if isinstance(payload, dict) else {}
            message = str(error.get("message") or "")
            status_name = str(error.get("status") or "")
        except (ValueError, AttributeError, TypeError):
            pass
    if not message:
        message = _CLIENT_PREFIX.sub("", str(exc.message or ""), count=1)
    code = exc.code if isinstance(exc.code, int) else None
    kind = _kind_from_text_and_status(code, f"{message} {exc.reason or ''} {status_name}", status_name)
    return CloudError(kind, message or type(exc).__name__, code, exc.reason or status_name)


def _kube_api_exception(exc: ApiException) -> CloudError:
    message, reason = "", ""
    body = exc.body
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if body:
        try:
            status = json.loads(body)
            if isinstance(status, dict):
                message = str(status.get("message") or "")
                reason = str(status.get("reason") or "")
        except ValueError:
            message = body.strip()[:2000]
    if not message:
        message = str(exc.reason or "") or f"HTTP {exc.status}"
    code = exc.status if isinstance(exc.status, int) and exc.status > 0 else None
    kind = _kind_from_text_and_status(code, message, reason)
    if code == 409 and reason == "AlreadyExists":
        kind = ErrorKind.ALREADY_EXISTS
    return CloudError(kind, message, code, reason or str(exc.reason or ""))


_TRANSPORT_TRANSIENT = (
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    requests.exceptions.ChunkedEncodingError,
    urllib3.exceptions.HTTPError,
    ConnectionError,
    TimeoutError,
)


def classify(exc: BaseException | status_pb2.Status) -> CloudError:
    """Map any client failure (or a DONE operation's google.rpc.Status) to a CloudError."""
    if isinstance(exc, CloudError):
        return exc
    if isinstance(exc, status_pb2.Status):
        return from_rpc_status(exc.code, exc.message)
    if isinstance(exc, gexc.RetryError):
        if exc.cause is not None:
            return classify(exc.cause)
        return CloudError(ErrorKind.TRANSIENT, str(exc.message or "retry deadline exceeded"))
    if isinstance(exc, gexc.GoogleAPICallError):
        return _google_call_error(exc)
    if isinstance(exc, ApiException):
        return _kube_api_exception(exc)
    if isinstance(exc, auth_exc.DefaultCredentialsError):
        return CloudError(ErrorKind.PERMANENT, f"no Google credentials: {exc}")
    if isinstance(exc, auth_exc.TransportError):
        return CloudError(ErrorKind.TRANSIENT, f"token request failed: {exc}")
    if isinstance(exc, auth_exc.RefreshError):
        transport_cause = isinstance(exc.__cause__, (auth_exc.TransportError, *_TRANSPORT_TRANSIENT))
        kind = ErrorKind.TRANSIENT if exc.retryable or transport_cause else ErrorKind.PERMANENT
        return CloudError(kind, f"token refresh failed: {exc}")
    if isinstance(exc, _TRANSPORT_TRANSIENT):
        return CloudError(ErrorKind.TRANSIENT, f"{type(exc).__name__}: {exc}")
    return CloudError(ErrorKind.PERMANENT, f"{type(exc).__name__}: {exc}")


def request_not_sent(exc: BaseException) -> bool:
    """True when the call failed before any request reached the server.

    Connection refused / connect timeout / no token: the server cannot have acted, so even
    a non-idempotent create may be repeated. Anything later (a 5xx, a read timeout) is
    ambiguous.
    """
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(
            cur,
            requests.exceptions.ConnectTimeout
            | urllib3.exceptions.NewConnectionError
            | urllib3.exceptions.ConnectTimeoutError
            | ConnectionRefusedError
            | auth_exc.TransportError
            | auth_exc.RefreshError,
        ):
            return True
        if isinstance(cur, urllib3.exceptions.MaxRetryError) and cur.reason is not None:
            cur = cur.reason
            continue
        nxt: Any = cur.__cause__ or cur.__context__
        if nxt is None and cur.args and isinstance(cur.args[0], BaseException):
            nxt = cur.args[0]  # requests wraps urllib3's error as its first argument
        cur = nxt
    return False
