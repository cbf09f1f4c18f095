"""Error replies in the two wire dialects the simulator speaks, and the middlewares that guarantee them.

Contract
--------
Handlers signal a failure by raising :class:`GoogleError` (GKE, Compute and
metadata routes) or :class:`KubeError` (Kubernetes routes). The matching
middleware turns it into the exact body the real service sends:

* Google: ``{"error": {"code": 404, "message": "...", "status": "NOT_FOUND"}}``
  with the same HTTP code (the client libraries pick the exception class from
  the HTTP code alone).
* Kubernetes: a ``Status`` object ``{"kind": "Status", "apiVersion": "v1",
  "metadata": {}, "status": "Failure", "message", "reason", "code"}``.

Anything else a handler raises (a bug, a malformed body that slipped through)
is answered 500 in the same dialect and logged; the server never dies on a
request. Unknown routes are answered 404 in the dialect of the port.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

GOOGLE_STATUS_BY_CODE = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}

KUBE_REASON_BY_CODE = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "AlreadyExists",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    500: "InternalError",
}


class GoogleError(Exception):
    """A failed Google API call: HTTP code, canonical status string and message."""

    def __init__(self, code: int, message: str, status: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status or GOOGLE_STATUS_BY_CODE.get(code, "UNKNOWN")

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, "status": self.status}}


class KubeError(Exception):
    """A failed Kubernetes API call, rendered as a ``Status`` object."""

    def __init__(self, code: int, message: str, reason: str | None = None, details: dict | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or KUBE_REASON_BY_CODE.get(code, "Unknown")
        self.details = details

    def status(self) -> dict[str, Any]:
        return kube_status(self.code, self.reason, self.message, self.details)


def kube_status(code: int, reason: str, message: str, details: dict | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=json.dumps(body).encode(),
        status=status,
        content_type="application/json",
        headers=headers,
    )


async def read_json_object(request: web.Request, dialect: str) -> dict[str, Any]:
    """The request body as a JSON object, or the dialect's 400."""
    raw = await request.read()
    try:
        data = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError) as e:
        msg = f"invalid JSON in request body: {e}"
        raise (GoogleError(400, msg) if dialect == "google" else KubeError(400, msg)) from None
    if not isinstance(data, dict):
        msg = "request body must be a JSON object"
        raise GoogleError(400, msg) if dialect == "google" else KubeError(400, msg)
    return data


@web.middleware
async def google_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Render GoogleError (and any crash) as Google's JSON error body."""
    try:
        return await handler(request)
    except GoogleError as e:
        return json_response(e.body(), e.code)
    except KubeError as e:  # a shared helper raised the other dialect; translate it
        return json_response(GoogleError(e.code, e.message).body(), e.code)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return json_response(GoogleError(e.status, e.reason or "error").body(), e.status)
    except Exception:  # noqa: BLE001 - the server must answer, not die
        log.exception("sim: unhandled error on %s %s", request.method, request.path)
        return json_response(GoogleError(500, "internal error in the simulator").body(), 500)


@web.middleware
async def kube_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Render KubeError (and any crash) as a Kubernetes Status body."""
    try:
        return await handler(request)
    except KubeError as e:
        return json_response(e.status(), e.code)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        if e.status == 404:
            msg = "the server could not find the requested resource"
        else:
            msg = e.reason or "error"
        return json_response(
            kube_status(e.status, KUBE_REASON_BY_CODE.get(e.status, "Unknown"), msg), e.status
        )
    except Exception:  # noqa: BLE001 - the server must answer, not die
        log.exception("sim: unhandled error on %s %s", request.method, request.path)
        return json_response(kube_status(500, "InternalError", "internal error in the simulator"), 500)
