"""Tokens and the GCE/GKE metadata server (how Workload Identity hands a pod its credentials).

Contract
--------
* :class:`TokenBook` issues random bearer tokens and remembers each one's issue
  time and expiry on the clock it is given (the fleet's). ``check(header, max_age)``
  accepts only ``Authorization: Bearer <token>`` for a token this fleet issued, that
  has not expired, and (when ``max_age`` is given - a cluster's ``token_ttl`` fault)
  is younger than ``max_age`` seconds.
* ``metadata_routes`` serves the subset of the metadata server that
  ``google.auth.default()`` and ``compute_engine.Credentials`` use, unchanged,
  once ``GCE_METADATA_HOST`` and ``GCE_METADATA_IP`` name the simulator:
  ``GET /`` (the residency ping), ``/computeMetadata/v1/project/project-id``,
  ``.../project/numeric-project-id``, ``.../universe/universe-domain``,
  ``.../instance/zone``, ``.../instance/service-accounts/`` and
  ``.../instance/service-accounts/{default|email}/`` (``?recursive=true`` JSON),
  ``.../email``, ``.../scopes``, ``.../token`` (GET, or POST for bound tokens)
  and ``.../identity?audience=`` (an unsigned JWT). Every answer carries
  ``Metadata-Flavor: Google``; a request without that header gets 403, as on GCE.
* :class:`CallerBook` remembers who called: per caller (the ``x-goog-api-client``
  header the Google client libraries send, else ``User-Agent``, which the Kubernetes
  audit log records as ``userAgent``), how many requests and how many changes (any
  method but GET/HEAD/OPTIONS) reached each API, and when the last ones came (the
  fleet's clock's time). Its middleware goes on every app; the control endpoints are
  not recorded.
* :func:`use_sim_metadata` points an already running Python process's
  google-auth at the simulator (google-auth reads ``GCE_METADATA_HOST`` once,
  at import).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import sys
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from falcon_ray.clock import SYSTEM, Clock

from .fleet import AuthConfig, MetadataConfig

FLAVOR = {"Metadata-Flavor": "Google"}
DEFAULT_SCOPES = [
    "https://www.googleapis.com/auth/cloud-platform",
    "https://www.googleapis.com/auth/userinfo.email",
]


@dataclass
class IssuedToken:
    issued_at: float  # the book's clock's monotonic time
    expires_at: float


class TokenBook:
    def __init__(self, auth: AuthConfig, clock: Clock = SYSTEM):
        self.clock = clock
        self.required = auth.required
        self.ttl = auth.token_ttl
        self._tokens: dict[str, IssuedToken] = {}
        self.issued_count = 0

    def issue(self) -> tuple[str, int]:
        now = self.clock.monotonic()
        if len(self._tokens) > 256:
            self._tokens = {t: v for t, v in self._tokens.items() if v.expires_at > now}
        token = "ya29.sim-" + secrets.token_urlsafe(24)
        self._tokens[token] = IssuedToken(now, now + self.ttl)
        self.issued_count += 1
        return token, max(1, int(self.ttl))

    def check(self, authorization: str | None, max_age: float | None = None) -> str | None:
        """None if the request may proceed, else the reason it may not."""
        if not self.required:
            return None
        if not authorization:
            return "missing Authorization header"
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return "Authorization header is not a bearer token"
        issued = self._tokens.get(token.strip())
        if issued is None:
            return "unknown bearer token"
        now = self.clock.monotonic()
        if now >= issued.expires_at:
            return "bearer token expired"
        if max_age is not None and now - issued.issued_at >= max_age:
            return "bearer token older than this cluster accepts"
        return None


READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class CallerBook:
    def __init__(self, clock: Clock = SYSTEM) -> None:
        self.clock = clock
        self.callers: dict[str, dict] = {}

    def record(self, user_agent: str, api: str, change: bool) -> None:
        now = self.clock.time()
        c = self.callers.setdefault(
            user_agent, {"requests": 0, "changes": 0, "apis": {}, "first_at": now, "last_at": now, "last_change_at": None}
        )
        c["requests"] += 1
        c["apis"][api] = c["apis"].get(api, 0) + 1
        c["last_at"] = now
        if change:
            c["changes"] += 1
            c["last_change_at"] = now

    def middleware(self, api_of: Callable[[web.Request], str | None]):
        """Record each request whose ``api_of(request)`` is not None, before it is served."""

        @web.middleware
        async def record_caller(request: web.Request, handler: Callable) -> web.StreamResponse:
            api = api_of(request)
            if api is not None:
                caller = request.headers.get("x-goog-api-client") or request.headers.get("User-Agent", "")
                self.record(caller, api, request.method not in READ_METHODS)
            return await handler(request)

        return record_caller

    def stats(self) -> dict[str, dict]:
        return {ua: {**c, "apis": dict(c["apis"])} for ua, c in self.callers.items()}


def _text(body: str) -> web.Response:
    return web.Response(text=body, content_type="application/text", headers=FLAVOR)


def _json(body: object) -> web.Response:
    return web.Response(text=json.dumps(body), content_type="application/json", headers=FLAVOR)


def metadata_routes(book: TokenBook, meta: MetadataConfig) -> list[web.RouteDef]:
    """Routes of the metadata server; mount them on the fleet's main app."""

    def flavor_missing(request: web.Request) -> web.Response | None:
        if request.headers.get("Metadata-Flavor") != "Google":
            return web.Response(
                status=403,
                text="Missing required header: Metadata-Flavor",
                headers=FLAVOR,
                content_type="text/plain",
            )
        return None

    def not_found() -> web.Response:
        return web.Response(status=404, text="Not Found", headers=FLAVOR, content_type="text/html")

    def account_ok(name: str) -> bool:
        return name in ("default", meta.service_account)

    async def root(request: web.Request) -> web.Response:
        return web.Response(text="computeMetadata/\n", content_type="application/text", headers=FLAVOR)

    async def simple(request: web.Request) -> web.Response:
        if refused := flavor_missing(request):
            return refused
        key = request.match_info["key"]
        values = {
            "project/project-id": meta.project_id,
            "project/numeric-project-id": meta.numeric_project_id,
            "universe/universe-domain": "googleapis.com",
            "instance/zone": f"projects/{meta.numeric_project_id}/zones/{meta.zone}",
            "instance/id": "4000000000000000001",
            "instance/hostname": "falcon-controller.sim.internal",
        }
        if key not in values:
            return not_found()
        return _text(values[key])

    async def accounts(request: web.Request) -> web.Response:
        if refused := flavor_missing(request):
            return refused
        if request.query.get("recursive") == "true":
            info = {"aliases": ["default"], "email": meta.service_account, "scopes": DEFAULT_SCOPES}
            return _json({"default": info, meta.service_account: info})
        return _text(f"default/\n{meta.service_account}/\n")

    async def account(request: web.Request) -> web.Response:
        if refused := flavor_missing(request):
            return refused
        name = request.match_info["account"]
        if not account_ok(name):
            return not_found()
        attr = request.match_info.get("attr", "")
        if attr == "":
            info = {"aliases": ["default"], "email": meta.service_account, "scopes": DEFAULT_SCOPES}
            if request.query.get("recursive") == "true":
                return _json(info)
            return _text("aliases\nemail\nidentity\nscopes\ntoken\n")
        if attr == "email":
            return _text(meta.service_account)
        if attr == "aliases":
            return _text("default\n")
        if attr == "scopes":
            return _text("\n".join(DEFAULT_SCOPES) + "\n")
        if attr == "token":
            token, expires_in = book.issue()
            return _json({"access_token": token, "expires_in": expires_in, "token_type": "Bearer"})
        if attr == "identity":
            audience = request.query.get("audience")
            if not audience:
                return web.Response(status=400, text="non-empty audience parameter required", headers=FLAVOR)
            return _text(_unsigned_id_token(meta.service_account, audience, int(book.ttl), int(book.clock.time())))
        return not_found()

    prefix = "/computeMetadata/v1"
    return [
        web.get("/", root),
        web.get(prefix + "/instance/service-accounts/", accounts),
        web.route("*", prefix + "/instance/service-accounts/{account}/", account),
        web.route("*", prefix + "/instance/service-accounts/{account}/{attr}", account),
        web.get(prefix + "/{key:(project|universe|instance)/[a-z-]+}", simple),
    ]


def _unsigned_id_token(email: str, audience: str, ttl: int, now: int) -> str:
    def b64(obj: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    claims = {
        "aud": audience,
        "azp": email,
        "email": email,
        "email_verified": True,
        "exp": now + ttl,
        "iat": now,
        "iss": "https://accounts.google.com",
        "sub": "100000000000000000001",
    }
    return f"{b64({'alg': 'RS256', 'typ': 'JWT', 'kid': 'falcon-sim'})}.{b64(claims)}.{secrets.token_urlsafe(32)}"


def use_sim_metadata(metadata_host: str) -> None:
    """Make ``google.auth.default()`` in this process use the simulator's metadata server.

    Sets ``GCE_METADATA_HOST`` and ``GCE_METADATA_IP`` and, if google-auth's
    metadata module was already imported (it reads the host only at import),
    updates its cached host as well.
    """
    os.environ["GCE_METADATA_HOST"] = metadata_host
    os.environ["GCE_METADATA_IP"] = metadata_host
    module = sys.modules.get("google.auth.compute_engine._metadata")
    if module is not None:
        module._GCE_METADATA_HOST = metadata_host  # type: ignore[attr-defined]
