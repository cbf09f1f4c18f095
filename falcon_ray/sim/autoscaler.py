"""The cluster autoscaler of one simulated cluster, for node pools with autoscaling enabled.

Contract
--------
:class:`Autoscaler` does what GKE's cluster autoscaler does to RUNNING pools whose
``autoscaling.enabled`` is true (GKE "About cluster autoscaling"; flex-start:
"Run a small batch workload with TPUs and flex-start provisioning mode"):

* **Scale-up.** A pod is a candidate when the scheduler left it Pending and
  unbound with ``PodScheduled=False`` / ``Unschedulable`` (it fits no existing
  node). It selects a pool when a node of that pool - its labels, zone and
  taints - would satisfy the pod's node selector, required node affinity and
  tolerations, and have room for its ``google.com/tpu``; it goes to the first
  such pool by name. ``timings.autoscaler_scale_up`` after a pool first has
  candidates (plus ``timings.flex_capacity_wait`` for a flex-start pool: the wait
  for its capacity), the autoscaler works out again how many nodes the pool's
  candidates need (packed onto empty nodes, less the nodes already provisioning),
  rounds up to whole slices for a multi-host TPU pool, caps at the pool's max,
  and adds what the capacity allows (cluster ``chips``, or the reservation's free
  hosts; nothing while a stockout of the pool's supply is on). The nodes register
  ``timings.node_register`` later. When nothing fits it keeps waiting and tries
  again after ``flex_capacity_wait`` (flex-start) or ``autoscaler_scale_up``
  (others): a scale-up never fails, it only waits. Each wait is drawn afresh
  (``SimCluster.draw``) when the timing is a distribution.
* **Scale-down.** A node of such a pool with no running or pending pod bound to
  it for the pool's ``config.consolidationDelay`` (when the cluster honours it,
  ``ClusterConfig.honours_consolidation_delay``, and the pool's request carries
  one), else for ``timings.autoscaler_scale_down``, is removed, never below the
  pool's min; a multi-host slice goes only as a whole, once all its nodes are due.

The pool's hosts, chips and reservation use change with its size (see
:class:`~falcon_ray.sim.node_pools.NodePools`). Work is triggered by pod and
node events and by pools turning RUNNING, and batched into one pass per loop
iteration, after the scheduler's. Every method must run on the loop thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .kube_store import WatchEvent
from .node_pools import TPU_RESOURCE, NodePool, node_object
from .selectors import node_matches, tolerates
from .workloads import TERMINAL

if TYPE_CHECKING:
    from .cluster import SimCluster

_DUE_SLACK = 0.01  # re-check a little after a node is due, so timer jitter cannot make it early


def unschedulable(pod: dict[str, Any]) -> bool:
    """Pending, unbound, and marked Unschedulable by the scheduler."""
    if (pod.get("spec") or {}).get("nodeName") or (pod.get("status") or {}).get(
        "phase", "Pending"
    ) != "Pending":
        return False
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def nodes_needed(pods: list[dict[str, Any]], chips_per_host: int, tpu: Callable[[dict[str, Any]], int]) -> int:
    """Empty nodes of ``chips_per_host`` TPU chips that hold ``pods`` (first fit, largest first);
    ``tpu``: a pod's ``tpu_request``."""
    if not pods:
        return 0
    if not chips_per_host:
        return 1  # CPU and memory are not accounted: one node holds any number of such pods
    free: list[int] = []
    for want in sorted((tpu(p) for p in pods), reverse=True):
        slot = next((i for i, room in enumerate(free) if room >= want), None)
        if slot is None:
            free.append(chips_per_host - want)
        else:
            free[slot] -= want
    return len(free)


def _fits(pod: dict[str, Any], pool: NodePool, node: dict[str, Any], want: int) -> bool:
    """True when ``node`` (a new node of ``pool``) would take the pod (``want``: its ``tpu_request``)."""
    spec = pod.get("spec") or {}
    if want > pool.chips_per_host:
        return False
    requested = {TPU_RESOURCE} if want else set()
    taints = (node.get("spec") or {}).get("taints") or []
    return node_matches(spec, node) and all(tolerates(spec, t, requested) for t in taints)


class Autoscaler:
    def __init__(self, cluster: SimCluster):
        self.cluster = cluster
        self.store = cluster.store
        self._pass_armed = False
        self._scale_up_armed: set[str] = set()  # pools with a scale-up attempt on a timer
        self._empty_since: dict[str, float] = {}  # node name -> monotonic time it became empty
        # pool name -> (the pool, its template): a pool's labels, zones and taints never change
        self._templates: dict[str, tuple[NodePool, dict[str, Any]]] = {}
        self.store.add_listener(self._on_event)

    def _on_event(self, ev: WatchEvent) -> None:
        if ev.plural in ("pods", "nodes"):
            self.poke()

    def poke(self) -> None:
        """Run one pass soon (after any pass already queued, such as the scheduler's)."""
        if not self._pass_armed:
            self._pass_armed = True
            self.cluster.call_soon(self._run_pass)

    def _run_pass(self) -> None:
        self._pass_armed = False
        pods = self.store.list("pods")
        demand = self._demand(pods)
        for pool in self.cluster.pools.autoscaled():
            if pool.name not in self._scale_up_armed and self._nodes_to_add(pool, demand) > 0:
                self._arm_scale_up(pool, self._first_wait(pool))
        self._scale_down(pods)

    # ---- scale-up ------------------------------------------------------------------------------
    def _first_wait(self, pool: NodePool) -> float:
        """Until the first scale-up attempt: the autoscaler's reaction, and for a flex-start
        pool the wait for its capacity."""
        draw = self.cluster.draw
        return draw("autoscaler_scale_up") + (draw("flex_capacity_wait") if pool.flex else 0.0)

    def _retry_wait(self, pool: NodePool) -> float:
        """Until the next attempt of a scale-up that found too little capacity."""
        return self.cluster.draw("flex_capacity_wait" if pool.flex else "autoscaler_scale_up")

    def _arm_scale_up(self, pool: NodePool, delay: float) -> None:
        self._scale_up_armed.add(pool.name)
        self.cluster.call_later(delay, self._scale_up, pool)

    def _scale_up(self, pool: NodePool) -> None:
        self._scale_up_armed.discard(pool.name)
        if pool not in self.cluster.pools.autoscaled():
            return
        wanted = self._nodes_to_add(pool, self._demand(self.store.list("pods")))
        if wanted <= 0:
            return
        free = self.cluster.pools.free_hosts(pool)
        fits = wanted if free is None else min(wanted, free - free % pool.slice_hosts)
        if fits > 0:
            self.cluster.pools.add_hosts(pool, fits)
        if fits < wanted:
            if free == 0 and self.cluster.stocked_out(pool.supply):
                self.cluster.fault_counts["stockout"] += 1
            self._arm_scale_up(pool, self._retry_wait(pool))  # no capacity yet: keep waiting

    def _demand(self, pods: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
        """Unschedulable pods by the autoscaled pool that takes them: the first by name they fit."""
        templates = [(pool, self._template(pool)) for pool in self.cluster.pools.autoscaled()]
        demand: dict[str, list[dict[str, Any]]] = {}
        tpu = self.cluster.workloads.pod_tpu
        for pod in filter(unschedulable, pods):
            want = tpu(pod)
            owner = next((pool for pool, node in templates if _fits(pod, pool, node, want)), None)
            if owner is not None:
                demand.setdefault(owner.name, []).append(pod)
        return demand

    def _template(self, pool: NodePool) -> dict[str, Any]:
        """What a new node of ``pool`` would look like (labels, zone, taints, capacity): made once
        per pool, since what ``_fits`` reads of it (labels, taints) depends only on the pool's
        request, name, supply, machine type, family and zones, which never change. Read only."""
        hit = self._templates.get(pool.name)
        if hit is not None and hit[0] is pool:
            return hit[1]
        node = node_object(self.cluster, pool, f"template-{pool.name}", 0, pool.zones[0])
        self._templates[pool.name] = (pool, node)
        return node

    def _nodes_to_add(self, pool: NodePool, demand: dict[str, list[dict[str, Any]]]) -> int:
        """Nodes ``pool`` should gain now: its pods packed on new nodes, less those provisioning."""
        assert pool.autoscaling is not None
        tpu = self.cluster.workloads.pod_tpu
        needed = nodes_needed(demand.get(pool.name, []), pool.chips_per_host, tpu) - pool.provisioning
        if needed <= 0:
            return 0
        step = pool.slice_hosts
        room = pool.autoscaling.max_nodes - pool.hosts
        return max(0, min(-(-needed // step) * step, room - room % step))

    # ---- scale-down ----------------------------------------------------------------------------
    def _scale_down(self, pods: list[dict[str, Any]]) -> None:
        busy = {
            (p.get("spec") or {}).get("nodeName")
            for p in pods
            if (p.get("status") or {}).get("phase", "Pending") not in TERMINAL
        }
        now = self.cluster.mono()
        watched: set[str] = set()
        for pool in self.cluster.pools.autoscaled():
            delay = self.scale_down_delay(pool)
            for node in pool.node_names:
                watched.add(node)
                if node in busy:
                    self._empty_since.pop(node, None)
                elif node not in self._empty_since:
                    self._empty_since[node] = now
                    self.cluster.call_later(delay + _DUE_SLACK, self.poke)
            due = {
                n for n in pool.node_names if now - self._empty_since.get(n, now) >= delay and n not in busy
            }
            doomed = self._removable(pool, due)
            if doomed:
                self.cluster.pools.remove_nodes(pool, doomed)
        self._empty_since = {n: t for n, t in self._empty_since.items() if n in watched}

    def scale_down_delay(self, pool: NodePool) -> float:
        """How long a node of ``pool`` stays empty before it is removed: the pool's
        ``consolidationDelay`` when it sent one and the cluster honours it, else
        ``timings.autoscaler_scale_down``."""
        if pool.consolidation_delay is not None and self.cluster.config.honours_consolidation_delay:
            return pool.consolidation_delay
        return self.cluster.timings.autoscaler_scale_down

    @staticmethod
    def _removable(pool: NodePool, due: set[str]) -> list[str]:
        """Due nodes that may go: whole slices, keeping at least the pool's min hosts."""
        assert pool.autoscaling is not None
        step, hosts, out = pool.slice_hosts, pool.hosts, []
        for i in range(0, len(pool.node_names), step):
            chunk = pool.node_names[i : i + step]
            if len(chunk) == step and due.issuperset(chunk) and hosts - step >= pool.autoscaling.min_nodes:
                out += chunk
                hosts -= step
        return out
