"""Every human-readable Message Falcon writes, in one catalogue.

Contract
--------
``text(key, **fields)`` renders the message for ``key`` in the language chosen by
``FALCON_LANG`` (``en`` by default, ``zh`` for the original design's own wording) or
by the ``lang`` argument. ``pattern(key, lang, **fields)`` is the regular expression that
finds a rendered message, each named field matched by the expression given for it, so a
reader of Messages (the API, the simulate judge) follows the catalogue's wording. Code never builds a Message string elsewhere, so the
upper layer sees one consistent vocabulary. Messages are cut to ``MAX_MESSAGE``
characters, the width of ``jobs.message``.
"""

from __future__ import annotations

import os
import re
import string

MAX_MESSAGE = 4000

_CATALOGUE: dict[str, tuple[str, str]] = {
    # Pending / (not yet taken)
    "only_inactive_clusters": (
        "No active cluster offers TPU type {tpu_type} (clusters {clusters} are in maintenance or offline); waiting for one to return...",
        "没有 active 集群提供 TPU 类型 {tpu_type}(集群 {clusters} 处于 maintenance/offline),等待集群恢复...",
    ),
    "requeued_unfit": (
        "Reservation {reservation} of cluster {cluster} holds {held}, not {machine_type}; choosing another cluster...",
        "集群 {cluster} 的 reservation {reservation} 只有 {held},没有 {machine_type},正在重新选择集群...",
    ),
    "requeued_too_small": (
        "Reservation {reservation} of cluster {cluster} holds {count} VM(s), fewer than the {hosts} a {topology} slice needs; choosing another cluster...",
        "集群 {cluster} 的 reservation {reservation} 只有 {count} 台 VM,少于 {topology} slice 所需的 {hosts} 台,正在重新选择集群...",
    ),
    "moved_to_idle": (
        "Moved from {origin} (reservation {reservation} busy) to {cluster}, which has an idle {topology} node pool; next to acquire resources there",
        "已从 {origin} (reservation {reservation} 容量不足) 转到有空闲 {topology} node pool 的 {cluster},下一个在该集群获取资源",
    ),
    "moved_after_refusal": (
        "Moved from {origin} to {cluster}: GKE had no {supply} capacity for its node pool on {origin} ({refusals} refusal(s) since {since}), and {why}; next to acquire resources there",
        "已从 {origin} 转到 {cluster}:{origin} 上 GKE 没有 {supply} 容量 (自 {since} 起被拒 {refusals} 次),而{why};下一个在该集群获取资源",
    ),
    "moved_why_idle": ("it has an idle node pool of the same supply", "该集群有相同供给模式的空闲 node pool"),
    "moved_why_empty": (
        "its queue for the topology is empty in another zone ({zone}), where GKE has not refused it",
        "该集群位于另一可用区 ({zone}),拓扑队列为空,GKE 尚未拒绝过该任务",
    ),
    "moved_to_reservation": (
        "Moved from {origin} (reservation {reservation} busy) to {cluster}, whose reservation {target_reservation} has room now; next to acquire resources there",
        "已从 {origin} (reservation {reservation} 容量不足) 转到 reservation {target_reservation} 有空余容量的 {cluster},下一个在该集群获取资源",
    ),
    "moved_to_reservation_queued": (
        "Moved from {origin} (reservation {reservation} busy) to {cluster}, whose reservation {target_reservation} has room now for it and the {ahead} task(s) of its queue there; queued behind them",
        "已从 {origin} (reservation {reservation} 容量不足) 转到 {cluster}:其 reservation {target_reservation} 现有空余容量,足够该任务及其队列中已有的 {ahead} 个任务;排在它们之后",
    ),
    "requeued": (
        "Cluster {cluster} left service ({status}); choosing another cluster...",
        "集群 {cluster} 已停止服务 ({status}),正在重新选择集群...",
    ),
    # Pending / Waiting
    "waiting": (
        "Queue position #{position}, {ahead} task(s) ahead ({tasks})",
        "队列位置 #{position},前面有 {ahead} 个任务 ({tasks})",
    ),
    "expected_start": (
        ", expected to start around {at} UTC, by {latest} UTC at the latest",
        ",预计约 {at} UTC 开始,最晚 {latest} UTC 开始",
    ),
    "waiting_since": (" (waiting since {at} UTC)", " (自 {at} UTC 起等待)"),
    "start_deadline_first": (
        "; its start deadline {deadline} UTC passes before its latest start",
        ";其启动截止时间 {deadline} UTC 早于最晚开始时间",
    ),
    "waiting_first": (
        "Queue position #1, next to acquire resources on {cluster} ({topology})",
        "队列位置 #1,下一个在 {cluster} ({topology}) 上获取资源",
    ),
    # Pending / acquisition
    "provisioning": (
        "Creating node pool {pool} (supply: {supply})...",
        "正在创建 node pool {pool} (supply: {supply})...",
    ),
    "picked": (
        "Selected to acquire resources (supply: {supply})...",
        "已选中,开始获取资源 (supply: {supply})...",
    ),
    "provisioning_reuse": (
        "Reusing idle node pool {pool} (supply: {supply})...",
        "复用空闲 node pool {pool} (supply: {supply})...",
    ),
    "cluster_busy": (
        "reservation_remaining_slices={remaining} reservation_needed_slices={needed}, waiting for reservation {reservation} capacity to free up...",
        "reservation_remaining_slices={remaining} reservation_needed_slices={needed},等待 reservation {reservation} 容量释放...",
    ),
    "reservation_held": (
        "; {hosts} host(s) of reservation {reservation} are held for task {task} ({topology}), waiting for them since {since} UTC: tasks of other topologies submitted after it take only the room beyond that",
        ";reservation {reservation} 的 {hosts} 台主机正为任务 {task} ({topology}) 保留,它自 {since} UTC 起等待这些主机: 在它之后提交的其他拓扑任务只能使用超出部分",
    ),
    "waiting_behind_reservation": (
        "; task {task} ahead of it waits for {hosts} host(s) of reservation {reservation}, free by {by} UTC at the latest (the run limits of the tasks on them)",
        ";排在它前面的任务 {task} 正在等待 reservation {reservation} 的 {hosts} 台主机,最迟 {by} UTC 空出 (按其上任务的运行时限)",
    ),
    "reservation_holding": (
        "; its {hosts} host(s) are held for it against newer tasks of other topologies, free by {by} UTC at the latest (the run limits of the tasks on them)",
        ";它所需的 {hosts} 台主机已为它保留,不再分给之后提交的其他拓扑任务,最迟 {by} UTC 空出 (按其上任务的运行时限)",
    ),
    "capacity_wait": (
        "No capacity for the node pool right now (supply: {supply}, refusal {refusals}), asking GKE again at {retry} UTC: {detail}",
        "当前没有可用容量创建 node pool (supply: {supply},第 {refusals} 次被拒),{retry} UTC 再次向 GKE 请求: {detail}",
    ),
    "capacity_retrying": (
        "Creating node pool {pool} again (supply: {supply}) after {refusals} capacity refusal(s); last: {detail}",
        "再次创建 node pool {pool} (supply: {supply}),此前因容量不足被拒 {refusals} 次;最近一次: {detail}",
    ),
    "capacity_budget_spent": (
        "no capacity within capacity_budget_s={limit}: waited {waited} over {refusals} refusal(s); last answer from GKE: {detail}",
        "在 capacity_budget_s={limit} 内没有等到容量: 已等待 {waited},共被拒 {refusals} 次;GKE 最近一次答复: {detail}",
    ),
    "cluster_unreachable": (
        "Cannot reach cluster {cluster} yet ({detail}); retrying...",
        "暂时无法连接集群 {cluster} ({detail}),重试中...",
    ),
    "reservation_unreadable": (
        "Cannot read reservation {reservation} yet ({detail}); retrying...",
        "暂时无法读取 reservation {reservation} ({detail}),重试中...",
    ),
    "cluster_busy_ops": (
        "GKE is busy with another operation on cluster {cluster}; retrying: {detail}",
        "集群 {cluster} 正在执行其他 GKE 操作,稍后重试: {detail}",
    ),
    "create_queued": (
        "Waiting to send the create of node pool {pool}: cluster {cluster} runs as many node-pool operations at a time as it takes and others go first{ahead}; queued since {since} UTC",
        "等待发送 node pool {pool} 的创建请求: 集群 {cluster} 同时执行的 node pool 操作已达上限,其他操作在前{ahead};自 {since} UTC 起排队",
    ),
    "create_queued_own": (" ({count} of them this queue's own)", " (其中 {count} 个属于本队列)"),
    "create_refused_busy": (
        "Waiting to send the create of node pool {pool} again: GKE refused it while cluster {cluster} runs another operation ({detail}); queued since {since} UTC",
        "等待再次发送 node pool {pool} 的创建请求: 集群 {cluster} 正在执行其他操作,GKE 拒绝了该请求 ({detail});自 {since} UTC 起排队",
    ),
    "flex_not_visible": (
        "node pool {pool} created (flex-start), not yet visible in the GKE API; rechecking...",
        "node pool {pool} 已创建 (flex-start),GKE API 暂不可见,稍后复查...",
    ),
    "waiting_for_node": (
        "node pool {pool} control-plane RUNNING but {registered}/{expected} expected node(s) registered (Ready={ready})...",
        "node pool {pool} control-plane RUNNING but {registered}/{expected} expected node(s) registered (Ready={ready})...",
    ),
    "waiting_for_node_job": (
        "node pool {pool} control-plane RUNNING but {registered}/{expected} expected node(s) registered (Ready={ready}); Job {job} submitted, its pods are pending until the nodes come (waiting since {since} UTC)...",
        "node pool {pool} control-plane RUNNING but {registered}/{expected} expected node(s) registered (Ready={ready});Job {job} 已提交,Pod 等待节点加入 (自 {since} UTC 起等待)...",
    ),
    "waiting_for_abandoned_pool": (
        "Waiting for node pool {pool}, whose create an aborted task started, to finish before it is handed over...",
        "等待 node pool {pool} 创建完成 (由已中止的任务发起),完成后交接使用...",
    ),
    "submit_retrying": (
        "Kubernetes Job submission refused for now, retrying (waiting since {since} UTC): {detail}",
        "K8s Job 提交暂时被拒绝,重试中 (自 {since} UTC 起等待): {detail}",
    ),
    "dispatching": (
        "Node pool {pool} ready, submitting the Kubernetes Job...",
        "Node pool {pool} 就绪,正在提交 K8s Job...",
    ),
    "dispatching_pods": (
        "Job {job} submitted, waiting for pods ({active}/{expected} active)...",
        "Job {job} 已提交,等待 Pod 启动 ({active}/{expected} active)...",
    ),
    # Pending / Recovering: the fleet ended a run, a new attempt is on the way
    "attempt": (
        "Attempt {attempt} of {attempts} after {kind} at {at} UTC ({detail})",
        "第 {attempt}/{attempts} 次尝试,上次运行因 {kind} 于 {at} UTC 中断 ({detail})",
    ),
    "recovering_job_gone": (
        "{attempt}: waiting for Job {job} of the disrupted run to be deleted (waiting since {since} UTC)...",
        "{attempt}: 等待被中断运行的 Job {job} 删除 (自 {since} UTC 起等待)...",
    ),
    "recovering_submit": (
        "{attempt}: submitting Job {job} on node pool {pool}...",
        "{attempt}: 正在 node pool {pool} 上提交 Job {job}...",
    ),
    "recovering_nodes": (
        "{attempt}: Job {job} submitted on node pool {pool}, waiting for its nodes to come back ({ready}/{expected} Ready, {active}/{expected} pods active; waiting since {since} UTC, at most {limit})...",
        "{attempt}: Job {job} 已提交到 node pool {pool},等待节点恢复 ({ready}/{expected} Ready,{active}/{expected} Pod active;自 {since} UTC 起等待,最多 {limit})...",
    ),
    "recovering_new_pool": (
        "{attempt}: {why}; acquiring a new node pool ahead of the queue",
        "{attempt}: {why};优先于队列中其他任务获取新的 node pool",
    ),
    "pool_gone": ("node pool {pool} is gone", "node pool {pool} 已不存在"),
    "pool_not_back": (
        "the nodes of node pool {pool} did not come back within {limit} (recovery_pool_wait_s)",
        "node pool {pool} 的节点在 {limit} 内没有恢复 (recovery_pool_wait_s)",
    ),
    "waiting_recovery": ("{attempt}; ", "{attempt};"),
    "waiting_released": (
        "Gave its node pool back at {at} UTC ({detail}); at the head of the queue (release {n} of at most {limit}); ",
        "已于 {at} UTC 交还 node pool ({detail});排在队首 (第 {n} 次交还,最多 {limit} 次);",
    ),
    "released_detail": (
        "node pool {pool} held {registered}/{expected} node(s) for {limit} since its first node came at {since} UTC while a task of another topology waited for cluster {cluster}'s capacity",
        "node pool {pool} 自首个节点于 {since} UTC 到达起 {limit} 内只有 {registered}/{expected} 个节点,而另一拓扑的任务在等待集群 {cluster} 的容量",
    ),
    "create_slow_detail": (
        "GKE did not bring node pool {pool}'s control plane up within {limit} of accepting its create ({detail})",
        "GKE 在接受创建后 {limit} 内未能使 node pool {pool} 的控制面就绪 ({detail})",
    ),
    "released_before": (
        "; it gave {n} earlier node pool(s) back first (pool_release_limit)",
        ";此前已交还 {n} 个 node pool (pool_release_limit)",
    ),
    "released_text": (
        "{detail}; gave the node pool back (it and its Job deleted), back at the head of the queue (release {n} of at most {limit})",
        "{detail};已交还 node pool (连同其 Job 已删除),回到队首 (第 {n} 次交还,最多 {limit} 次)",
    ),
    "capacity_not_delivered": (
        "Capacity not delivered in time: {detail}; the task gave its node pool back {n} time(s), the most pool_release_limit allows. The fleet's capacity, not a fault of the task; it may be submitted again",
        "容量未能及时交付: {detail};任务已交还 node pool {n} 次,达到 pool_release_limit 上限。这是集群容量问题,不是任务本身的问题,可重新提交",
    ),
    "switched_to_idle": (
        "Took idle node pool {pool}, whose nodes are Ready, instead of waiting for the nodes of its own node pool {own} (deleted)",
        "改用 node pool {pool} (空闲,节点已 Ready),不再等待自己的 node pool {own} 的节点 (已删除)",
    ),
    # Running / Succeeded
    "running": ("Pod running ({active}/{expected} active)", "Pod 运行中 ({active}/{expected} active)"),
    "running_attempt": ("Pod running ({active}/{expected} active); {attempt}", "Pod 运行中 ({active}/{expected} active);{attempt}"),
    "succeeded": ("", ""),
    # Failed
    "invalid_spec": ("Invalid task spec: {detail}", "任务 spec 无效: {detail}"),
    "unsupported_tpu_type": (
        "No registered cluster offers TPU type {tpu_type} (offered: {offered})",
        "没有已注册集群提供 TPU 类型 {tpu_type} (已有: {offered})",
    ),
    "no_candidate_cluster": (
        "No active {tpu_type} cluster can serve a {topology} slice ({machine_type}, supply: {supply}): {detail}",
        "没有 active {tpu_type} 集群能提供 {topology} slice ({machine_type}, supply: {supply}): {detail}",
    ),
    "offer_reservation": (
        "{cluster}: reservation {reservation} holds {machine_type} ({topologies})",
        "{cluster}: reservation {reservation} 只有 {machine_type} ({topologies})",
    ),
    "offer_reservation_size": (
        "{cluster}: reservation {reservation} holds {count} VM(s), fewer than the {hosts} a {topology} slice needs",
        "{cluster}: reservation {reservation} 只有 {count} 台 VM,少于 {topology} slice 所需的 {hosts} 台",
    ),
    "offer_no_reservation": (
        "{cluster}: no reservation",
        "{cluster}: 未配置 reservation",
    ),
    "offer_flex_start_max_run": (
        "{cluster}: flex-start, whose VMs run at most {limit} (maxRunDuration), "
        "shorter than the task's timeout_seconds {seconds}",
        "{cluster}: flex-start,其 VM 最多运行 {limit} (maxRunDuration),"
        "短于任务的 timeout_seconds {seconds}",
    ),
    "offer_supply": (
        "{cluster}: {supply} {tpu_type}, any topology",
        "{cluster}: {supply} {tpu_type},任意拓扑",
    ),
    "node_pool_timeout": (
        "Node pool creation timed out ({limit}): {detail}",
        "node pool 创建超时 ({limit}): {detail}",
    ),
    "reservation_wait_over": (
        "no free slice in the reservation for {limit} (reservation_wait_limit_s); ",
        "reservation 在 {limit} 内没有可用 slice (reservation_wait_limit_s); ",
    ),
    "create_queue_over": (
        "GKE did not accept the create of node pool {pool} within {limit} (create_queue_limit_s): it waited behind cluster {cluster}'s other node-pool operations since {since} UTC. The cluster's node-pool operations are saturated; the task itself did nothing wrong and may be submitted again",
        "node pool {pool} 的创建请求在 {limit} (create_queue_limit_s) 内未被 GKE 接受: 自 {since} UTC 起一直排在集群 {cluster} 的其他 node pool 操作之后。集群的 node pool 操作已饱和,任务本身没有问题,可重新提交",
    ),
    "nodes_not_delivered": (
        "GKE did not deliver the nodes of node pool {pool} ({registered}/{expected} registered, supply: {supply}) within capacity_budget_s={limit} (waited {waited}); the capacity was not there, not a fault of the task",
        "GKE 在 capacity_budget_s={limit} 内没有提供 node pool {pool} 的节点 (已注册 {registered}/{expected},supply: {supply},已等待 {waited});是容量不足,不是任务本身的问题",
    ),
    "nodes_not_delivered_moving": (
        "{detail}; its Job and node pool are deleted; moving it to another cluster that can start it now, else asking this cluster once more...",
        "{detail};已删除其 Job 和 node pool;若有可立即启动它的其他集群则转过去,否则在本集群再请求一次...",
    ),
    "node_pool_failed": ("Node pool creation failed: {detail}", "node pool 创建失败: {detail}"),
    "job_submit_failed": ("Kubernetes Job submission failed: {detail}", "K8s Job 提交失败: {detail}"),
    "job_failed": ("{detail}", "{detail}"),
    "disrupted": (
        "The fleet disrupted this task's runs {count} time(s), more than its max_recoveries ({limit}) allows: {history}",
        "集群侧故障中断了该任务的运行 {count} 次,超过 max_recoveries ({limit}): {history}",
    ),
    "disruption_item": (
        "#{n} {kind} on node {node} at {at} UTC ({detail})",
        "#{n} {kind},节点 {node},{at} UTC ({detail})",
    ),
    "timeout": ("Task timed out ({seconds}s), Job cancelled", "任务超时 ({seconds}s),已取消 Job"),
    "start_deadline_exceeded": (
        "Not started by its start deadline {deadline} UTC (start_deadline_s={limit} after its submission at {created} UTC): it was {phase}, {waiting} since {since} UTC{detail}",
        "未能在启动截止时间 {deadline} UTC 前开始运行 (提交于 {created} UTC,start_deadline_s={limit}): 当时处于 {phase},自 {since} UTC 起{waiting}{detail}",
    ),
    "start_deadline_detail": ("; its last Message: {message}", ";最近的消息: {message}"),
    "deadline_wait_new": ("waiting to be placed on a cluster", "等待被分配到集群"),
    "deadline_wait_waiting": (
        "waiting in queue {cluster}/{topology} for its turn to acquire resources",
        "在队列 {cluster}/{topology} 中排队等待获取资源",
    ),
    "deadline_wait_create": ("waiting to create its node pool (supply: {supply})", "等待创建 node pool (supply: {supply})"),
    "deadline_wait_provisioning": (
        "waiting for node pool {pool} to be created (supply: {supply})",
        "等待 node pool {pool} 创建完成 (supply: {supply})",
    ),
    "deadline_wait_cluster_busy": ("waiting for {supply} capacity on cluster {cluster}", "等待集群 {cluster} 的 {supply} 容量"),
    "deadline_wait_nodes": (
        "waiting for {supply} capacity: the nodes of node pool {pool}",
        "等待 {supply} 容量: node pool {pool} 的节点",
    ),
    "deadline_wait_dispatching": (
        "waiting for the pods of its Job on node pool {pool}",
        "等待其 Job 在 node pool {pool} 上的 Pod 启动",
    ),
    # Abort
    "aborting": (
        "Aborting, waiting for the Kubernetes Job to be deleted and the node pool cleaned up...",
        "正在中止,等待 K8s Job 删除和 node pool 清理...",
    ),
    "aborted": ("Aborted by user", "用户中止"),
    # Suffix when the pool could not be deleted yet
    "pool_not_deleted": (
        " (node pool {pool} not yet deleted: {detail}; Falcon keeps retrying)",
        " (node pool {pool} 尚未删除: {detail};Falcon 会继续重试)",
    ),
}


def lang() -> str:
    return "zh" if os.environ.get("FALCON_LANG", "en").lower().startswith("zh") else "en"


def text(key: str, lang_: str | None = None, **fields: object) -> str:
    en, zh = _CATALOGUE[key]
    template = zh if (lang_ or lang()) == "zh" else en
    out = template.format(**fields)
    return out if len(out) <= MAX_MESSAGE else out[: MAX_MESSAGE - 3] + "..."


def pattern(key: str, lang_: str, **fields: str) -> re.Pattern[str]:
    """The expression that finds ``key``'s message in ``lang_``: its text literally, each of
    ``fields`` matched by the expression given for it (groups number in the text's order),
    any other field by anything (as little as it can)."""
    en, zh = _CATALOGUE[key]
    names = {name for _, name, _, _ in string.Formatter().parse(zh if lang_ == "zh" else en) if name}
    given = {name: fields.get(name, ".*?") for name in names | set(fields)}
    marks = {name: f"\x00{i}\x00" for i, name in enumerate(given)}
    expr = re.escape(text(key, lang_, **marks))
    for name, mark in marks.items():
        expr = expr.replace(re.escape(mark), given[name])
    return re.compile(expr)


def keys() -> list[str]:
    return list(_CATALOGUE)
