"""errors.classify on exceptions built the way the real clients build them.

Google errors go through ``google.api_core.exceptions.from_http_response`` (what the
REST transports call on a >= 400 response); Kubernetes errors are ``ApiException``s made
from a urllib3 response (what the kubernetes client does); transport errors come from
real failed connections. The same mapping is exercised end to end against the simulated
fleet in tests/clients/.
"""

from __future__ import annotations

import json
import pickle
import socket

import pytest
import requests
import urllib3
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exc
from google.rpc import status_pb2
from kubernetes.client.exceptions import ApiException

from falcon_ray.errors import CloudError, ErrorKind, classify, from_rpc_status, request_not_sent

URL = "http://127.0.0.1:9/v1/projects/p/locations/us-east5-b/clusters/c/nodePools"


def google_error(code: int, message: str, status: str, reason: str | None = None) -> gexc.GoogleAPICallError:
    error: dict = {"code": code, "message": message, "status": status}
    if reason:
        error["details"] = [
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": reason,
                "domain": "googleapis.com",
            }
        ]
    response = requests.Response()
    response.status_code = code
    response._content = json.dumps({"error": error}).encode()
    response.headers["content-type"] = "application/json"
    response.request = requests.Request("POST", URL).prepare()
    return gexc.from_http_response(response)


def kube_error(code: int, message: str | None, reason: str) -> ApiException:
    body = (
        b""
        if message is None
        else json.dumps(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "message": message,
                "reason": reason,
                "code": code,
            }
        ).encode()
    )
    return ApiException(
        http_resp=urllib3.HTTPResponse(body=body, status=code, reason=reason, preload_content=True)
    )


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- Google --------------------------------------------------------------------------

GOOGLE_CASES = [
    (
        404,
        "Not found: projects/p/locations/l/clusters/c/nodePools/x.",
        "NOT_FOUND",
        None,
        ErrorKind.NOT_FOUND,
    ),
    (
        409,
        "Already exists: projects/p/.../nodePools/falcon-t1-2x4.",
        "ALREADY_EXISTS",
        None,
        ErrorKind.ALREADY_EXISTS,
    ),
    (
        400,
        "Cluster is running incompatible operation operation-1700. Please wait and try again once it is done.",
        "FAILED_PRECONDITION",
        None,
        ErrorKind.INCOMPATIBLE_OPERATION,
    ),
    (
        400,
        "Operation operation-17 is currently creating node pool falcon-t1-2x4. Please wait and try again.",
        "FAILED_PRECONDITION",
        None,
        ErrorKind.INCOMPATIBLE_OPERATION,
    ),
    (400, "Node version 1.20 is not supported.", "FAILED_PRECONDITION", None, ErrorKind.PERMANENT),
    (400, "Invalid value for field 'machineType'.", "INVALID_ARGUMENT", None, ErrorKind.PERMANENT),
    (429, "Too many operations on cluster c.", "RESOURCE_EXHAUSTED", None, ErrorKind.TOO_MANY_OPERATIONS),
    (
        429,
        "Quota exceeded for quota metric 'Mutate requests' and limit 'Mutate requests per minute' of service.",
        "RESOURCE_EXHAUSTED",
        "RATE_LIMIT_EXCEEDED",
        ErrorKind.TOO_MANY_OPERATIONS,
    ),
    (
        403,
        "Insufficient regional quota to satisfy request: resource \"TPUS_PER_PROJECT\": request requires '8.0'.",
        "PERMISSION_DENIED",
        None,
        ErrorKind.QUOTA_EXCEEDED,
    ),
    (
        429,
        "Quota 'TPUS_PER_PROJECT' exceeded. Limit: 8.0 in region us-east5.",
        "RESOURCE_EXHAUSTED",
        "QUOTA_EXCEEDED",
        ErrorKind.QUOTA_EXCEEDED,
    ),
    (
        400,
        "The zone 'us-east5-b' does not have enough resources available to fulfill the request.",
        "FAILED_PRECONDITION",
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        ErrorKind.STOCKOUT,
    ),
    (
        403,
        "Required 'container.nodePools.create' permission.",
        "PERMISSION_DENIED",
        None,
        ErrorKind.PERMANENT,
    ),
    (401, "Request had invalid authentication credentials.", "UNAUTHENTICATED", None, ErrorKind.TRANSIENT),
    (500, "Internal error.", "INTERNAL", None, ErrorKind.TRANSIENT),
    (503, "The service is currently unavailable.", "UNAVAILABLE", None, ErrorKind.TRANSIENT),
]


@pytest.mark.parametrize(("code", "message", "status", "reason", "kind"), GOOGLE_CASES)
def test_google_http_errors(code, message, status, reason, kind):
    exc = google_error(code, message, status, reason)
    assert exc.message.startswith("POST http://")  # what the client gives...
    err = classify(exc)
    assert err.kind == kind
    assert err.message == message  # ...and what Falcon keeps: the API's own text
    assert err.status_code == code
    assert err.retryable == (
        kind in {ErrorKind.TRANSIENT, ErrorKind.TOO_MANY_OPERATIONS, ErrorKind.INCOMPATIBLE_OPERATION}
    )


def test_failed_precondition_arrives_as_bad_request():
    exc = google_error(400, "Please wait and try again.", "FAILED_PRECONDITION")
    assert isinstance(exc, gexc.BadRequest) and not isinstance(exc, gexc.FailedPrecondition)
    assert classify(exc).kind == ErrorKind.INCOMPATIBLE_OPERATION


def test_retry_error_is_classified_by_its_last_cause():
    cause = google_error(503, "backend unavailable", "UNAVAILABLE")
    err = classify(gexc.RetryError("Timeout of 1.0s exceeded", cause))
    assert (err.kind, err.message, err.status_code) == (ErrorKind.TRANSIENT, "backend unavailable", 503)
    assert classify(gexc.RetryError("Timeout of 1.0s exceeded", None)).kind == ErrorKind.TRANSIENT


# --- operations ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "message", "kind"),
    [
        (8, "ZONE_RESOURCE_POOL_EXHAUSTED: no TPU capacity in us-east5-b", ErrorKind.STOCKOUT),
        (8, "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", ErrorKind.STOCKOUT),
        (8, "GCE_STOCKOUT", ErrorKind.STOCKOUT),
        (8, "RESOURCE_EXHAUSTED", ErrorKind.STOCKOUT),  # code 8 naming no quota: no capacity now
        (8, "resource pool exhausted", ErrorKind.STOCKOUT),
        (
            8,
            "The zone 'projects/p/zones/us-east5-b' does not have enough resources available to fulfill the request. "
            "Try a different zone, or try again later.",
            ErrorKind.STOCKOUT,
        ),
        (8, "Reservation res-a has no remaining capacity", ErrorKind.STOCKOUT),
        (8, "Quota 'TPUS_PER_PROJECT' exceeded. Limit: 8.0 in region us-east5.", ErrorKind.QUOTA_EXCEEDED),
        (3, "Insufficient quota 'TPUS': requested 8, available 4", ErrorKind.QUOTA_EXCEEDED),
        (5, "Reservation 'projects/p/zones/us-east5-b/reservations/r' was not found.", ErrorKind.NOT_FOUND),
        (13, "Internal error creating instance group", ErrorKind.TRANSIENT),
        (14, "Backend unavailable", ErrorKind.TRANSIENT),
        (9, "Cluster is running incompatible operation operation-9.", ErrorKind.INCOMPATIBLE_OPERATION),
        (3, "Invalid machine type ct6e-standard-9t", ErrorKind.PERMANENT),
        (7, "Permission denied on reservation", ErrorKind.PERMANENT),
        (5, "Node pool falcon-t1-2x4 not found", ErrorKind.NOT_FOUND),
    ],
)
def test_operation_errors(code, message, kind):
    err = classify(status_pb2.Status(code=code, message=message))
    assert err.kind == kind and err.message == message
    assert from_rpc_status(code, message).kind == kind
    assert err.status_code is not None


def test_operation_error_code_8_maps_to_http_429_and_keeps_the_name():
    err = from_rpc_status(8, "ZONE_RESOURCE_POOL_EXHAUSTED")
    assert (err.status_code, err.reason, err.retryable) == (429, "RESOURCE_EXHAUSTED", False)


# --- Kubernetes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "message", "reason", "kind"),
    [
        (404, 'jobs.batch "falcon-task-1" not found', "NotFound", ErrorKind.NOT_FOUND),
        (409, 'jobs.batch "falcon-task-1" already exists', "AlreadyExists", ErrorKind.ALREADY_EXISTS),
        (
            409,
            "the object has been modified; please apply your changes to the latest version",
            "Conflict",
            ErrorKind.TRANSIENT,
        ),
        (
            400,
            'admission webhook "policy.example.com" denied the request: image registry not allowed',
            "BadRequest",
            ErrorKind.PERMANENT,
        ),
        (
            403,
            'jobs.batch is forbidden: User "x" cannot create resource "jobs"',
            "Forbidden",
            ErrorKind.PERMANENT,
        ),
        (
            403,
            'pods "p" is forbidden: exceeded quota: tpu-quota, requested: google.com/tpu=4, used: 8, limited: 8',
            "Forbidden",
            ErrorKind.QUOTA_EXCEEDED,
        ),
        (
            422,
            'Job.batch "x" is invalid: spec.template.spec.containers[0].image: Required value',
            "Invalid",
            ErrorKind.PERMANENT,
        ),
        (429, "too many requests", "TooManyRequests", ErrorKind.TOO_MANY_OPERATIONS),
        (500, "Internal error occurred: failed calling webhook", "InternalError", ErrorKind.TRANSIENT),
        (401, "Unauthorized", "Unauthorized", ErrorKind.TRANSIENT),
    ],
)
def test_kubernetes_api_exceptions(code, message, reason, kind):
    err = classify(kube_error(code, message, reason))
    assert (err.kind, err.message, err.status_code, err.reason) == (kind, message, code, reason)


def test_watch_410_without_body():
    # What kubernetes.watch raises for an ERROR event when a timeout is set.
    err = classify(ApiException(status=410, reason="Expired: too old resource version: 1 (10)"))
    assert err.status_code == 410 and err.kind == ErrorKind.TRANSIENT
    assert "too old resource version" in err.message


def test_kubernetes_status_0_ssl_failure_is_transient():
    assert (
        classify(ApiException(status=0, reason="SSLError\ncertificate verify failed")).kind
        == ErrorKind.TRANSIENT
    )


# --- transport and auth --------------------------------------------------------------


def test_refused_connections_are_transient_and_known_unsent():
    port = closed_port()
    with pytest.raises(requests.exceptions.ConnectionError) as via_requests:
        requests.get(f"http://127.0.0.1:{port}/", timeout=2)
    pool = urllib3.PoolManager(retries=urllib3.Retry(0))
    with pytest.raises(urllib3.exceptions.MaxRetryError) as via_urllib3:
        pool.request("GET", f"http://127.0.0.1:{port}/", timeout=2)
    for exc in (via_requests.value, via_urllib3.value):
        err = classify(exc)
        assert err.kind == ErrorKind.TRANSIENT and err.status_code is None
        assert request_not_sent(exc)


def test_read_timeouts_are_transient_but_ambiguous():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with pytest.raises(requests.exceptions.ReadTimeout) as info:
            requests.get(f"http://127.0.0.1:{port}/", timeout=(2, 0.2))
    assert classify(info.value).kind == ErrorKind.TRANSIENT
    assert not request_not_sent(info.value)
    assert not request_not_sent(google_error(503, "x", "UNAVAILABLE"))


def test_auth_errors():
    try:
        try:
            raise auth_exc.TransportError("metadata server unreachable")
        except auth_exc.TransportError as cause:
            raise auth_exc.RefreshError("Failed to retrieve token") from cause
    except auth_exc.RefreshError as exc:
        refresh = exc
    assert classify(refresh).kind == ErrorKind.TRANSIENT and request_not_sent(refresh)
    assert classify(auth_exc.RefreshError("invalid_grant")).kind == ErrorKind.PERMANENT
    assert classify(auth_exc.DefaultCredentialsError("none")).kind == ErrorKind.PERMANENT


def test_unknown_exceptions_are_permanent_and_named():
    err = classify(ValueError("bad"))
    assert err.kind == ErrorKind.PERMANENT and err.message == "ValueError: bad"


# --- CloudError itself ---------------------------------------------------------------


def test_cloud_error_is_stable_picklable_and_readable():
    err = CloudError(ErrorKind.QUOTA_EXCEEDED, "quota 'TPUS_PER_PROJECT' exceeded", 403, "QUOTA_EXCEEDED")
    assert classify(err) is err
    again = pickle.loads(pickle.dumps(err))
    assert repr(again) == repr(err) and again.kind is ErrorKind.QUOTA_EXCEEDED
    assert str(err) == "quota 'TPUS_PER_PROJECT' exceeded"
    assert ErrorKind.INCOMPATIBLE_OPERATION.value == "incompatible_operation"
    assert not err.retryable
