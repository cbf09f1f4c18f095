"""The Kubernetes API of one simulated cluster, served on its own loopback port.

Contract
--------
``kube_app(cluster, book, closing)`` builds the aiohttp application. It serves
``batch/v1`` Jobs and ``v1`` Pods, Nodes, Services and Events with the
semantics the official ``kubernetes`` client relies on:

* create -> 201 (409 ``AlreadyExists`` on a taken name, 422 ``Invalid`` for a
  Job without containers, with a restartPolicy other than Never/OnFailure, or
  Indexed without completions); get -> 404 ``NotFound``; replace (PUT, 409
  ``Conflict`` on a stale resourceVersion); patch (merge, strategic - applied as
  a JSON merge patch - and JSON patch); the ``status`` subresource; delete with
  ``propagationPolicy`` (query or DeleteOptions body; deleting a Job deletes its
  pods unless ``Orphan`` - note the real API defaults to Orphan for batch/v1
  Jobs, so always send Background; ``Foreground`` answers 200 with the Job, which
  now has ``deletionTimestamp`` and the ``foregroundDeletion`` finalizer and goes
  once its pods are gone, see :meth:`Workloads.delete_job`); deletecollection; pod ``log``.
* Server-side metadata from :class:`ObjectStore`; Job defaulting as the API
  server does it (selector on ``controller-uid``, template labels, parallelism,
  completions, backoffLimit 6, completionMode).
* list with ``labelSelector``, ``fieldSelector``, ``limit``/``continue`` and
  ``metadata.resourceVersion``.
* ``?watch=true``: without resourceVersion (or "0") the current objects come
  first as ADDED; with one, history is replayed from it, or - when it is older
  than the kept window - HTTP 200 with one ``ERROR`` event holding a 410
  ``Expired`` Status, as the real apiserver answers (a version newer than the
  store's gets a 504 ``Timeout`` "Too large resource version" the same way). ``allowWatchBookmarks``
  adds BOOKMARKs every ``timings.watch_bookmark_interval`` and one just before
  ``timeoutSeconds`` ends the stream. Objects entering or leaving a selector
  arrive as ADDED / DELETED. The ``watch_drop_every`` fault aborts the TCP
  connection mid-stream that many seconds after the watch opened. These times are
  the cluster's clock's: on a fleet given a clock they pass when the test moves it.
* Admission (:mod:`falcon_ray.sim.kube_admission`): wrongly typed bodies get 400,
  invalid ones 422, and a Job or Pod whose container image starts with a prefix
  in the ``deny_images`` fault is refused 403 with an admission-webhook message;
  with the ``webhook_unavailable`` fault every Job and Pod create is answered 500
  ``InternalError`` (the webhook cannot be called and its failurePolicy is Fail).
  Patch bodies are applied by :mod:`falcon_ray.sim.kube_patch`.
* Authentication: ``Authorization: Bearer <token issued by the fleet>``; the
  cluster's ``token_ttl`` fault caps the accepted token age. ``/version``,
  ``/healthz``, ``/livez`` and ``/readyz`` are public, as with default RBAC.
* Every failure is a ``Status`` body; nothing a client sends can crash the server.
"""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from falcon_ray.clock import SYSTEM

from . import kube_admission as admission
from .errors import KubeError, json_response, kube_errors, kube_status, read_json_object
from .kube_patch import json_patch, merge_patch
from .kube_store import RESOURCES, ResourceKind, WatchEvent, clone
from .selectors import FieldSelector, LabelSelector, parse_field_selector, parse_label_selector

if TYPE_CHECKING:
    from .auth import TokenBook
    from .cluster import SimCluster

DEFAULT_WATCH_TIMEOUT = 1800.0
CLIENT_CHECK_INTERVAL = 1.0
PUBLIC_PATHS = ("/version", "/healthz", "/livez", "/readyz")
_SERVER_METADATA = (
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "selfLink",
)


class KubeApi:
    """Request handlers bound to one cluster."""

    def __init__(self, cluster: SimCluster, book: TokenBook, closing: asyncio.Event):
        self.cluster = cluster
        self.store = cluster.store
        self.book = book
        self.closing = closing
        self._service_ips = 10

    # ---- routing -------------------------------------------------------------------------------
    @web.middleware
    async def authenticate(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        if request.path not in PUBLIC_PATHS:
            problem = self.book.check(request.headers.get("Authorization"), self.cluster.faults.token_ttl)
            if problem is not None:
                self.cluster.fault_counts["token_rejected"] += 1
                raise KubeError(401, "Unauthorized", "Unauthorized")
        return await handler(request)

    def _resolve(
        self, api_version: str, rest: str
    ) -> tuple[ResourceKind, str | None, str | None, str | None]:
        parts = [p for p in rest.split("/")]
        if parts and parts[-1] == "":
            parts.pop()
        ns = name = sub = None
        if len(parts) >= 3 and parts[0] == "namespaces":
            ns, plural = parts[1], parts[2]
            rest_parts = parts[3:]
        elif parts:
            plural = parts[0]
            rest_parts = parts[1:]
        else:
            raise web.HTTPNotFound()
        if len(rest_parts) > 2:
            raise web.HTTPNotFound()
        if rest_parts:
            name = rest_parts[0]
        if len(rest_parts) == 2:
            sub = rest_parts[1]
        rk = RESOURCES.get(plural)
        if rk is None or rk.api_version != api_version:
            raise web.HTTPNotFound()
        if ns is not None and not rk.namespaced:
            raise web.HTTPNotFound()
        if name is not None and rk.namespaced and ns is None:
            raise web.HTTPNotFound()
        if (sub is not None and sub not in ("status", "log")) or (sub == "log" and plural != "pods"):
            raise web.HTTPNotFound()
        return rk, ns, name, sub

    async def core(self, request: web.Request) -> web.StreamResponse:
        rest = request.match_info["rest"]
        parts = [p for p in rest.split("/") if p]
        if parts and parts[0] == "namespaces" and len(parts) <= 2:
            return await self._namespaces(request, parts[1] if len(parts) == 2 else None)
        return await self._dispatch(request, "v1", rest)

    async def grouped(self, request: web.Request) -> web.StreamResponse:
        gv = f"{request.match_info['group']}/{request.match_info['version']}"
        return await self._dispatch(request, gv, request.match_info["rest"])

    async def _dispatch(self, request: web.Request, api_version: str, rest: str) -> web.StreamResponse:
        rk, ns, name, sub = self._resolve(api_version, rest)
        method = request.method
        if name is None:
            if method == "GET":
                if request.query.get("watch") in ("true", "1"):
                    return await self._watch(request, rk, ns)
                return self._list(request, rk, ns)
            if method == "POST":
                if rk.namespaced and ns is None:
                    raise KubeError(405, "the server does not allow this method on the requested resource")
                return await self._create(request, rk, ns or "")
            if method == "DELETE":
                return self._delete_collection(request, rk, ns)
        else:
            key_ns = ns or ""
            if method == "GET":
                if sub == "log":
                    return self._pod_log(request, key_ns, name)
                return json_response(self._get(rk, key_ns, name))
            if method == "PUT":
                return await self._replace(request, rk, key_ns, name, sub)
            if method == "PATCH":
                return await self._patch(request, rk, key_ns, name, sub)
            if method == "DELETE" and sub is None:
                return await self._delete(request, rk, key_ns, name)
        raise KubeError(
            405, "the server does not allow this method on the requested resource", "MethodNotAllowed"
        )

    # ---- reading -------------------------------------------------------------------------------
    def _get(self, rk: ResourceKind, ns: str, name: str) -> dict[str, Any]:
        obj = self.store.get(rk.plural, ns, name)
        if obj is None:
            raise admission.not_found(rk, name)
        return obj

    @staticmethod
    def _selectors(request: web.Request) -> tuple[LabelSelector, FieldSelector]:
        try:
            return (
                parse_label_selector(request.query.get("labelSelector")),
                parse_field_selector(request.query.get("fieldSelector")),
            )
        except ValueError as e:
            raise KubeError(400, str(e), "BadRequest") from None

    def _list(self, request: web.Request, rk: ResourceKind, ns: str | None) -> web.Response:
        labels, fields = self._selectors(request)
        items = [
            o
            for o in self.store.list(rk.plural, ns)
            if labels.matches(o["metadata"].get("labels")) and fields.matches(o)
        ]
        metadata: dict[str, Any] = {"resourceVersion": str(self.store.rv)}
        token = request.query.get("continue")
        if token:
            try:
                after = tuple(json.loads(base64.urlsafe_b64decode(token.encode())))
            except (ValueError, TypeError):
                raise KubeError(400, "continue key is not valid", "BadRequest") from None
            items = [o for o in items if (o["metadata"].get("namespace", ""), o["metadata"]["name"]) > after]
        limit_text = request.query.get("limit")
        if limit_text:
            try:
                limit = int(limit_text)
            except ValueError:
                raise KubeError(400, f"invalid limit {limit_text!r}", "BadRequest") from None
            if 0 < limit < len(items):
                last = items[limit - 1]["metadata"]
                key = [last.get("namespace", ""), last["name"]]
                metadata["continue"] = base64.urlsafe_b64encode(json.dumps(key).encode()).decode()
                metadata["remainingItemCount"] = len(items) - limit
                items = items[:limit]
        return json_response(
            {"kind": rk.list_kind, "apiVersion": rk.api_version, "metadata": metadata, "items": items}
        )

    def _pod_log(self, request: web.Request, ns: str, name: str) -> web.Response:
        pod = self._get(RESOURCES["pods"], ns, name)
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        container = request.query.get("container") or (statuses[0]["name"] if statuses else "")
        status = next((s for s in statuses if s.get("name") == container), None)
        if status is None:
            names = [c.get("name") for c in pod["spec"].get("containers") or []]
            if container and container not in names:
                raise KubeError(400, f"container {container} is not valid for pod {name}", "BadRequest")
            raise KubeError(
                400, f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating'
            )
        waiting = (status.get("state") or {}).get("waiting")
        if waiting:
            raise KubeError(
                400,
                f'container "{container}" in pod "{name}" is waiting to start: {waiting.get("reason", "")}',
            )
        lines = [
            line
            for line in self.cluster.workloads.logs.get(pod["metadata"]["uid"], [])
            if f" container {container} " in line
        ]
        tail = request.query.get("tailLines")
        if tail and tail.isdigit():
            lines = lines[-int(tail) :] if int(tail) else []
        return web.Response(text="".join(line + "\n" for line in lines), content_type="text/plain")

    async def _namespaces(self, request: web.Request, name: str | None) -> web.Response:
        def ns_obj(n: str) -> dict[str, Any]:
            return {
                "kind": "Namespace",
                "apiVersion": "v1",
                "metadata": {"name": n, "labels": {"kubernetes.io/metadata.name": n}},
                "spec": {"finalizers": ["kubernetes"]},
                "status": {"phase": "Active"},
            }

        if request.method == "POST" and name is None:
            body = await read_json_object(request, "kube")
            new = (body.get("metadata") or {}).get("name")
            if not isinstance(new, str) or not admission.DNS_LABEL.match(new):
                raise KubeError(422, f'Namespace "{new}" is invalid: metadata.name: Invalid value', "Invalid")
            return json_response(ns_obj(new), 201)
        if request.method != "GET":
            raise KubeError(
                405, "the server does not allow this method on the requested resource", "MethodNotAllowed"
            )
        if name is not None:
            return json_response(ns_obj(name))
        names = {"default", "kube-system"}
        for plural, rk in RESOURCES.items():
            if rk.namespaced:
                names.update(o["metadata"].get("namespace", "") for o in self.store.list(plural))
        items = [ns_obj(n) for n in sorted(n for n in names if n)]
        return json_response(
            {
                "kind": "NamespaceList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self.store.rv)},
                "items": items,
            }
        )

    # ---- writing -------------------------------------------------------------------------------
    def _check_body_identity(self, rk: ResourceKind, body: dict[str, Any], ns: str) -> dict[str, Any]:
        if "apiVersion" in body and body["apiVersion"] != rk.api_version:
            raise KubeError(
                400,
                f"the API version in the data ({body['apiVersion']}) does not match the expected API version "
                f"({rk.api_version})",
            )
        if "kind" in body and body["kind"] != rk.kind:
            raise KubeError(
                400, f"the kind in the data ({body['kind']}) does not match the expected kind ({rk.kind})"
            )
        md = body.get("metadata")
        if md is None:
            md = body["metadata"] = {}
        if not isinstance(md, dict):
            raise KubeError(400, "metadata must be an object")
        if rk.namespaced:
            if md.get("namespace") not in (None, "", ns):
                raise KubeError(
                    400,
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            md["namespace"] = ns
        admission.validate_metadata(rk, md)
        return md

    def _next_service_ip(self) -> str:
        self._service_ips += 1
        return f"10.96.{self._service_ips // 250}.{self._service_ips % 250 + 1}"

    async def _create(self, request: web.Request, rk: ResourceKind, ns: str) -> web.Response:
        body = await read_json_object(request, "kube")
        received = clone(body)
        md = self._check_body_identity(rk, body, ns)
        for key in _SERVER_METADATA:
            md.pop(key, None)
        if not md.get("name"):
            prefix = md.get("generateName")
            if not prefix:
                raise admission.invalid(
                    rk,
                    "",
                    "metadata.name",
                    "FieldValueRequired",
                    "Required value: name or generateName is required",
                )
            suffix = "".join(self.cluster.rng.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))
            md["name"] = f"{prefix}{suffix}"
        name = admission.validate_name(rk, md["name"])
        uid = str(uuid.uuid4())
        deny = self.cluster.faults.deny_images
        if rk.plural in ("jobs", "pods") and self.cluster.faults.webhook_unavailable:
            self.cluster.fault_counts["webhook_unavailable"] += 1
            admission.webhook_unreachable(rk, name)
        if rk.plural == "jobs":
            admission.default_job(body, name, uid)
            admission.deny_images(rk, name, body["spec"]["template"]["spec"], deny)
        elif rk.plural == "pods":
            admission.default_pod(body, name)
            admission.deny_images(rk, name, body["spec"], deny)
        elif rk.plural == "services":
            admission.default_service(body, self._next_service_ip)
        admission.validate_status(rk, body)
        obj = self.store.create(rk.plural, body, uid=uid)
        if rk.plural == "jobs":
            self.cluster.record_job_create(obj, received)
        return json_response(obj, 201)

    def _apply_update(
        self, rk: ResourceKind, current: dict[str, Any], new: Any, sub: str | None
    ) -> dict[str, Any]:
        """Store ``new`` (a PUT body or a patched copy) over ``current``: main resource or ``status``."""
        md = current["metadata"]
        if not isinstance(new, dict):
            raise KubeError(400, "the object must be a JSON object")
        new_md = new.get("metadata")
        if not isinstance(new_md, dict):
            new_md = new["metadata"] = {}
        if new_md.get("name", md["name"]) != md["name"]:
            raise KubeError(
                400,
                f"the name of the object ({new_md.get('name')}) does not match the name on the URL ({md['name']})",
            )
        rv = new_md.get("resourceVersion")
        if rv not in (None, "") and str(rv) != md["resourceVersion"]:
            raise admission.conflict(
                rk,
                md["name"],
                "the object has been modified; please apply your changes to the latest version and try again",
            )
        if sub == "status":
            result = clone(current)
            result["status"] = clone(new.get("status") or {})
        else:
            result = clone(new)
            if "status" in current:
                result["status"] = clone(current["status"])
            for key, value in md.items():
                if key in _SERVER_METADATA or key in ("name", "namespace"):
                    result["metadata"][key] = value
            for key in _SERVER_METADATA:
                if key not in md:  # a client cannot set them (e.g. deletionTimestamp)
                    result["metadata"].pop(key, None)
            result["kind"], result["apiVersion"] = rk.kind, rk.api_version
            admission.validate_metadata(rk, result["metadata"])
            if rk.plural == "jobs":
                admission.validate_job_spec(md["name"], result.get("spec"))
            elif rk.plural == "pods":
                admission.validate_pod_spec(rk, md["name"], result.get("spec"), "spec")
        admission.validate_status(rk, result)
        if result == current:
            return current
        return self.store.update(rk.plural, result, current)

    async def _replace(
        self, request: web.Request, rk: ResourceKind, ns: str, name: str, sub: str | None
    ) -> web.Response:
        current = self._get(rk, ns, name)
        body = await read_json_object(request, "kube")
        self._check_body_identity(rk, body, ns)
        return json_response(self._apply_update(rk, current, body, sub))

    async def _patch(
        self, request: web.Request, rk: ResourceKind, ns: str, name: str, sub: str | None
    ) -> web.Response:
        current = self._get(rk, ns, name)
        ctype = request.content_type
        raw = await request.read()
        try:
            patch = json.loads(raw or b"null")
        except (ValueError, UnicodeDecodeError) as e:
            raise KubeError(400, f"invalid JSON in patch: {e}") from None
        if ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            if not isinstance(patch, dict):
                raise KubeError(400, "a merge patch must be a JSON object")
            new = merge_patch(clone(current), patch)
        elif ctype == "application/json-patch+json":
            if not isinstance(patch, list):
                raise KubeError(400, "a JSON patch must be a list of operations")
            new = json_patch(current, patch)
        else:
            raise KubeError(
                415,
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json",
                "UnsupportedMediaType",
            )
        return json_response(self._apply_update(rk, current, new, sub))

    async def _delete_options(self, request: web.Request) -> dict[str, Any]:
        opts: dict[str, Any] = {}
        raw = await request.read()
        if raw.strip():
            try:
                parsed = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as e:
                raise KubeError(400, f"invalid DeleteOptions: {e}") from None
            if isinstance(parsed, dict):
                opts.update(parsed)
        if "propagationPolicy" in request.query:
            opts["propagationPolicy"] = request.query["propagationPolicy"]
        policy = opts.get("propagationPolicy")
        if policy not in (None, "Orphan", "Background", "Foreground"):
            raise KubeError(
                422,
                f'DeleteOptions.propagationPolicy: Unsupported value: "{policy}": supported values: '
                '"Foreground", "Background", "Orphan"',
                "Invalid",
            )
        if opts.get("orphanDependents") is True and policy is None:
            opts["propagationPolicy"] = "Orphan"
        return opts

    async def _delete(self, request: web.Request, rk: ResourceKind, ns: str, name: str) -> web.Response:
        opts = await self._delete_options(request)
        current = self._get(rk, ns, name)
        pre = opts.get("preconditions") or {}
        md = current["metadata"]
        if (pre.get("uid") and pre["uid"] != md["uid"]) or (
            pre.get("resourceVersion") and pre["resourceVersion"] != md["resourceVersion"]
        ):
            raise admission.conflict(rk, name, "Precondition failed")
        deleted = self._delete_one(rk, ns, name, opts.get("propagationPolicy") or "Background")
        if rk.plural in ("pods", "services"):
            return json_response(deleted)  # the API answers these deletes with the object
        if rk.plural == "jobs" and self.store.get(rk.plural, ns, name) is deleted:
            # not removed yet (Foreground: deletionTimestamp and the foregroundDeletion finalizer):
            # the apiserver answers 200 with the object as it now is
            return json_response(deleted)
        return json_response(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {"name": name, "group": admission.group(rk), "kind": rk.plural, "uid": md["uid"]},
            }
        )

    def _delete_one(self, rk: ResourceKind, ns: str, name: str, propagation: str) -> dict[str, Any] | None:
        if rk.plural == "jobs":
            return self.cluster.workloads.delete_job(ns, name, propagation)
        if rk.plural == "nodes":
            node = self.store.get("nodes", "", name)
            self.cluster.remove_node(name)
            return node
        return self.store.delete(rk.plural, ns, name)

    def _delete_collection(self, request: web.Request, rk: ResourceKind, ns: str | None) -> web.Response:
        labels, fields = self._selectors(request)
        policy = request.query.get("propagationPolicy") or "Background"
        victims = [
            o
            for o in self.store.list(rk.plural, ns)
            if labels.matches(o["metadata"].get("labels")) and fields.matches(o)
        ]
        for o in victims:
            self._delete_one(rk, o["metadata"].get("namespace", ""), o["metadata"]["name"], policy)
        return json_response(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Success",
                "details": {"kind": rk.plural},
            }
        )

    # ---- watch ---------------------------------------------------------------------------------
    async def _watch(self, request: web.Request, rk: ResourceKind, ns: str | None) -> web.StreamResponse:
        labels, fields = self._selectors(request)
        q = request.query
        try:
            timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else DEFAULT_WATCH_TIMEOUT
        except ValueError:
            raise KubeError(400, f"invalid timeoutSeconds {q.get('timeoutSeconds')!r}") from None
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        send_initial = q.get("sendInitialEvents") in ("true", "1")
        rv_text = q.get("resourceVersion", "")
        filtering = bool(labels.requirements or fields.terms)

        def matches(obj: dict[str, Any] | None) -> bool:
            if obj is None:
                return False
            if ns is not None and obj["metadata"].get("namespace") != ns:
                return False
            return labels.matches(obj["metadata"].get("labels")) and fields.matches(obj)

        def view(ev: WatchEvent) -> bytes | None:
            now_in = matches(ev.obj)
            if ev.type == "MODIFIED" and filtering:
                was_in = matches(ev.prev)
                if now_in and was_in:
                    return ev.encode()
                if now_in:
                    return ev.encode("ADDED")
                if was_in:
                    return ev.encode("DELETED")
                return None
            return ev.encode() if now_in else None

        store = self.store
        prepared: web.StreamResponse | None = None
        watcher = store.subscribe(rk.plural)
        opened = self.cluster.clock.monotonic()  # its timeout, bookmarks and cut count from here
        try:
            # Snapshot and subscription happen in the same loop step: no event is lost or repeated.
            first: list[bytes] = []
            snapshot_rv = store.rv
            if rv_text in ("", "0") or send_initial:
                first = [
                    json.dumps({"type": "ADDED", "object": o}).encode() + b"\n"
                    for o in store.list(rk.plural, ns)
                    if matches(o)
                ]
            else:
                try:
                    since = int(rv_text)
                except ValueError:
                    raise KubeError(400, f"invalid resource version {rv_text!r}") from None
                if since > store.rv:  # e.g. a resourceVersion from before the simulator restarted
                    return await self._watch_error(
                        request, 504, "Timeout", f"Too large resource version: {since}, current: {store.rv}"
                    )
                events = store.events_since(rk.plural, since)
                if events is None:
                    self.cluster.fault_counts["watch_410"] += 1
                    return await self._watch_error(
                        request,
                        410,
                        "Expired",
                        f"too old resource version: {since} ({store.compacted_rv + 1})",
                    )
                first = [line for line in (view(e) for e in events) if line is not None]

            resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            prepared = resp
            for line in first:
                await resp.write(line)
            if send_initial and bookmarks:
                await resp.write(self._bookmark(rk, snapshot_rv, initial_end=True))

            clock = self.cluster.clock
            virtual = clock is not SYSTEM  # a given clock: SimFleet.advance pokes the watch when it moves
            deadline = opened + timeout
            next_bookmark = opened + self.cluster.timings.watch_bookmark_interval
            while not self.closing.is_set():
                if request.transport is None or request.transport.is_closing():
                    return resp  # the client hung up; stop holding a subscription for it
                now = clock.monotonic()
                drop_every = self.cluster.faults.watch_drop_every
                drop_at = opened + drop_every if drop_every else float("inf")
                if now >= drop_at:
                    self.cluster.fault_counts["watch_cut"] += 1
                    self._cut(request)
                    return resp
                if now >= deadline:
                    break
                if bookmarks and now >= next_bookmark:
                    await self._drain(watcher, view, resp, snapshot_rv)
                    await resp.write(self._bookmark(rk, store.rv))
                    next_bookmark = now + self.cluster.timings.watch_bookmark_interval
                    continue
                # wake at least every CLIENT_CHECK_INTERVAL (the machine's seconds) to notice
                # clients that went away; on a given clock the deadlines are re-read when it moves
                wake = min(deadline, drop_at, next_bookmark if bookmarks else float("inf"))
                wait = CLIENT_CHECK_INTERVAL if virtual else min(wake - now, CLIENT_CHECK_INTERVAL)
                try:
                    ev = await asyncio.wait_for(watcher.queue.get(), max(0.0, wait))
                except TimeoutError:
                    continue
                if ev is None or ev.rv <= snapshot_rv:
                    continue
                line = view(ev)
                if line is not None:
                    await resp.write(line)
            await self._drain(watcher, view, resp, snapshot_rv)
            if bookmarks:
                await resp.write(self._bookmark(rk, store.rv))
            await resp.write_eof()
            return resp
        except ConnectionError:
            if prepared is None:
                raise
            return prepared  # the client went away mid-stream; nothing more to send
        finally:
            store.unsubscribe(watcher)

    @staticmethod
    async def _drain(
        watcher: Any, view: Callable[[WatchEvent], bytes | None], resp: web.StreamResponse, floor: int
    ) -> None:
        while not watcher.queue.empty():
            ev = watcher.queue.get_nowait()
            if ev is None or ev.rv <= floor:
                continue
            line = view(ev)
            if line is not None:
                await resp.write(line)

    @staticmethod
    def _bookmark(rk: ResourceKind, rv: int, initial_end: bool = False) -> bytes:
        md: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            md["annotations"] = {"k8s.io/initial-events-end": "true"}
        return (
            json.dumps(
                {
                    "type": "BOOKMARK",
                    "object": {"kind": rk.kind, "apiVersion": rk.api_version, "metadata": md},
                }
            ).encode()
            + b"\n"
        )

    async def _watch_error(
        self, request: web.Request, code: int, reason: str, message: str
    ) -> web.StreamResponse:
        """HTTP 200 carrying one ERROR event: how the apiserver refuses a watch it accepted."""
        status = kube_status(code, reason, message)
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
        await resp.write_eof()
        return resp

    @staticmethod
    def _cut(request: web.Request) -> None:
        transport = request.transport
        if transport is not None:
            transport.abort()

    # ---- discovery -----------------------------------------------------------------------------
    async def version(self, request: web.Request) -> web.Response:
        return json_response(
            {
                "major": "1",
                "minor": "33",
                "gitVersion": "v1.33.5-gke.1080000",
                "platform": "linux/amd64",
                "goVersion": "go1.24",
                "compiler": "gc",
            }
        )

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok", content_type="text/plain")

    async def discovery(self, request: web.Request) -> web.Response:
        path = request.path.rstrip("/")
        if path == "/api":
            return json_response(
                {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
            )
        if path == "/apis":
            return json_response(
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [
                        {
                            "name": "batch",
                            "versions": [{"groupVersion": "batch/v1", "version": "v1"}],
                            "preferredVersion": {"groupVersion": "batch/v1", "version": "v1"},
                        }
                    ],
                }
            )
        gv = "v1" if path == "/api/v1" else path.removeprefix("/apis/")
        resources = [
            {
                "name": rk.plural,
                "singularName": rk.kind.lower(),
                "namespaced": rk.namespaced,
                "kind": rk.kind,
                "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            }
            for rk in RESOURCES.values()
            if rk.api_version == gv
        ]
        if not resources:
            raise web.HTTPNotFound()
        return json_response(
            {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}
        )


def kube_app(cluster: SimCluster, book: TokenBook, closing: asyncio.Event, middlewares: tuple = ()) -> web.Application:
    api = KubeApi(cluster, book, closing)
    app = web.Application(middlewares=[*middlewares, kube_errors, api.authenticate], client_max_size=16 * 1024 * 1024)
    app.router.add_get("/version", api.version)
    for path in ("/healthz", "/livez", "/readyz"):
        app.router.add_get(path, api.health)
    for path in (
        "/api",
        "/api/",
        "/apis",
        "/apis/",
        "/api/v1",
        "/api/v1/",
        "/apis/batch/v1",
        "/apis/batch/v1/",
    ):
        app.router.add_get(path, api.discovery)
    app.router.add_route("*", "/api/v1/{rest:.+}", api.core)
    app.router.add_route("*", "/apis/{group}/{version}/{rest:.+}", api.grouped)
    return app
