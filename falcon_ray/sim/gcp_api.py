"""GKE v1 and Compute v1 REST routes, as ``container_v1`` (transport="rest") and ``compute_v1`` call them.

Contract
--------
Routes (``{p}`` project, ``{l}`` location = the cluster's zone, or its region for
a regional cluster):

* ``GET  /v1/projects/{p}/locations/{l}/clusters[/{c}]`` - clusters.list / get;
  ``endpoint`` is ``127.0.0.1:<port of that cluster's Kubernetes API>`` (plain
  HTTP), ``masterAuth.clusterCaCertificate`` a base64 PEM-shaped text.
* ``POST /v1/projects/{p}/locations/{l}/clusters/{c}/nodePools`` - create,
  body ``{"nodePool": {...}}``, returns an Operation.
* ``GET  .../nodePools`` -> ``{"nodePools": [...]}``; ``GET .../nodePools/{np}``;
  ``DELETE .../nodePools/{np}`` -> Operation.
* ``GET  /v1/projects/{p}/locations/{l}/operations[/{op}]``.
* ``GET  /compute/v1/projects/{p}/zones/{z}/reservations[/{r}]`` - a reservation
  exists only in its own zone (``reservation.zone``, default the cluster's zone
  or first node location); asked in another zone it is 404, as Compute says it. It
  lives in its owner's project (``reservation.project``, default the cluster's): a
  reservation shared from another project is read there.
* ``GET  /compute/v1/projects/{p}/regions/{r}/resourcePolicies/{name}`` - a workload
  policy a cluster of project ``p`` in region ``r`` declares (``workload_policies``);
  404 for any other name.

Behaviour: enums are read as numbers or names; answers are camelCase and use
enum numbers when the request asked ``$alt=json;enum-encoding=int`` (as the
client does), names otherwise. Every call first checks the bearer token
(401 UNAUTHENTICATED), then draws the cluster's ``api_error_rate`` /
``too_many_requests_rate`` faults (503 / 429). An unknown project is 403
PERMISSION_DENIED; an unknown cluster, pool, operation or reservation 404.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from .errors import GoogleError, json_response, read_json_object

if TYPE_CHECKING:
    from .cluster import SimCluster
    from .server import SimFleet

UNAUTHENTICATED = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other "
    "valid authentication credential."
)


def gcp_routes(fleet: SimFleet) -> list[web.RouteDef]:
    def enums_as_int(request: web.Request) -> bool:
        return "enum-encoding=int" in request.query.get("$alt", "")

    def authenticate(request: web.Request, cluster: SimCluster | None) -> None:
        max_age = cluster.faults.token_ttl if cluster is not None else None
        if fleet.book.check(request.headers.get("Authorization"), max_age) is not None:
            if cluster is not None:
                cluster.fault_counts["token_rejected"] += 1
            raise GoogleError(401, UNAUTHENTICATED, "UNAUTHENTICATED")

    def known_project(project: str) -> None:
        if not any(project in (c.config.project, c.config.reservation_project) for c in fleet.clusters.values()):
            raise GoogleError(
                403,
                f"Permission denied on resource project {project} (or it may not exist).",
                "PERMISSION_DENIED",
            )

    def find_cluster(request: web.Request) -> SimCluster:
        p, loc, name = (
            request.match_info["project"],
            request.match_info["location"],
            request.match_info["cluster"],
        )
        cluster = fleet.clusters.get(name)
        found = cluster is not None and cluster.config.project == p and cluster.config.location == loc
        authenticate(request, cluster if found else None)
        known_project(p)
        if not found:
            raise GoogleError(404, f"Not found: projects/{p}/locations/{loc}/clusters/{name}.")
        assert cluster is not None
        cluster.inject_api_fault()
        return cluster

    async def get_cluster(request: web.Request) -> web.Response:
        cluster = find_cluster(request)
        return json_response(cluster.cluster_json(fleet.ca_b64, enums_as_int(request)))

    async def list_clusters(request: web.Request) -> web.Response:
        p, loc = request.match_info["project"], request.match_info["location"]
        authenticate(request, None)
        known_project(p)
        items = [
            c.cluster_json(fleet.ca_b64, enums_as_int(request))
            for c in fleet.clusters.values()
            if c.config.project == p and (loc == "-" or c.config.location == loc)
        ]
        return json_response({"clusters": items})

    async def create_pool(request: web.Request) -> web.Response:
        cluster = find_cluster(request)
        body = await read_json_object(request, "google")
        op = cluster.pools.create(body)
        return json_response(op.to_json(enums_as_int(request)))

    async def list_pools(request: web.Request) -> web.Response:
        cluster = find_cluster(request)
        as_int = enums_as_int(request)
        return json_response({"nodePools": [p.to_json(cluster, as_int) for p in cluster.pools.visible()]})

    async def get_pool(request: web.Request) -> web.Response:
        cluster = find_cluster(request)
        pool = cluster.pools.get(request.match_info["pool"])
        return json_response(pool.to_json(cluster, enums_as_int(request)))

    async def delete_pool(request: web.Request) -> web.Response:
        cluster = find_cluster(request)
        op = cluster.pools.delete(request.match_info["pool"])
        return json_response(op.to_json(enums_as_int(request)))

    async def get_operation(request: web.Request) -> web.Response:
        p, loc, name = (
            request.match_info["project"],
            request.match_info["location"],
            request.match_info["operation"],
        )
        owner = next(
            (
                c
                for c in fleet.clusters.values()
                if c.config.project == p and c.config.location == loc and name in c.pools.operations
            ),
            None,
        )
        authenticate(request, owner)
        known_project(p)
        if owner is None:
            raise GoogleError(404, f"Not found: operation {name} in projects/{p}/locations/{loc}.")
        owner.inject_api_fault()
        return json_response(owner.pools.operations[name].to_json(enums_as_int(request)))

    async def list_operations(request: web.Request) -> web.Response:
        p, loc = request.match_info["project"], request.match_info["location"]
        authenticate(request, None)
        known_project(p)
        as_int = enums_as_int(request)
        ops = [
            op.to_json(as_int)
            for c in fleet.clusters.values()
            if c.config.project == p and (loc == "-" or c.config.location == loc)
            for op in c.pools.operations.values()
        ]
        return json_response({"operations": ops})

    def reservation_owner(request: web.Request, name: str | None) -> list[SimCluster]:
        p, zone = request.match_info["project"], request.match_info["zone"]
        owners = [
            c
            for c in fleet.clusters.values()
            if c.config.reservation_project == p
            and c.config.reservation_zone == zone
            and c.config.reservation is not None
            and (name is None or c.config.reservation.name == name)
        ]
        authenticate(request, owners[0] if owners else None)
        known_project(p)
        return owners

    async def get_reservation(request: web.Request) -> web.Response:
        name = request.match_info["reservation"]
        owners = reservation_owner(request, name)
        if not owners:
            p, zone = request.match_info["project"], request.match_info["zone"]
            raise GoogleError(
                404, f"The resource 'projects/{p}/zones/{zone}/reservations/{name}' was not found"
            )
        owners[0].inject_api_fault()
        return json_response(owners[0].reservation_json())

    async def list_reservations(request: web.Request) -> web.Response:
        owners = reservation_owner(request, None)
        for c in owners:
            c.inject_api_fault()
        return json_response(
            {"kind": "compute#reservationList", "items": [c.reservation_json() for c in owners]}
        )

    async def get_resource_policy(request: web.Request) -> web.Response:
        p, region, name = (
            request.match_info["project"],
            request.match_info["region"],
            request.match_info["policy"],
        )
        owners = [
            c
            for c in fleet.clusters.values()
            if c.config.project == p and c.region == region and c.workload_policy(name) is not None
        ]
        authenticate(request, owners[0] if owners else None)
        known_project(p)
        if not owners:
            raise GoogleError(404, f"The resource 'projects/{p}/regions/{region}/resourcePolicies/{name}' was not found")
        owners[0].inject_api_fault()
        return json_response(owners[0].resource_policy_json(name))

    base = "/v1/projects/{project}/locations/{location}"
    cluster_path = base + "/clusters/{cluster}"
    compute = "/compute/v1/projects/{project}/zones/{zone}/reservations"
    return [
        web.get(base + "/clusters", list_clusters),
        web.get(cluster_path, get_cluster),
        web.post(cluster_path + "/nodePools", create_pool),
        web.get(cluster_path + "/nodePools", list_pools),
        web.get(cluster_path + "/nodePools/{pool}", get_pool),
        web.delete(cluster_path + "/nodePools/{pool}", delete_pool),
        web.get(base + "/operations", list_operations),
        web.get(base + "/operations/{operation}", get_operation),
        web.get(compute, list_reservations),
        web.get(compute + "/{reservation}", get_reservation),
        web.get("/compute/v1/projects/{project}/regions/{region}/resourcePolicies/{policy}", get_resource_policy),
    ]
