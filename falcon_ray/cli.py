"""`falcon-ray`: the operator's command line.

The product's commands: ``db upgrade``, ``clusters``, ``submit``, ``abort``, ``status`` and
``render`` need only the database (or nothing); ``run``, ``queues`` and ``health`` need Ray
and come from ``falcon_ray.controller_cli``. The development tools (``demo``, ``chaos``,
``bench``, ``sim``...) are registered by ``falcon_ray.devtools.commands`` when that package
is installed; an image built without it (deploy/Dockerfile) answers them with one line
saying so and exit 1.

Every command takes ``--db URL`` (default: ``$FALCON_DB_URL``, else
``sqlite:///falcon.db``) and prints a table, or JSON with ``--json``. Errors are
one line on stderr and a non-zero exit: 1 for a refused operation or a database
problem, 2 for invalid input (click's usage errors and an invalid task spec). The
options, errors and output helpers shared by the command modules are in
``falcon_ray.cli_shared``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import click
import sqlalchemy as sa
import yaml

from falcon_ray import controller_cli, render, scheduling, tpu
from falcon_ray import lifecycle as lc
from falcon_ray.cli_shared import (  # noqa: F401  (re-exported: the commands' helpers as cli.*)
    CliError,
    InvalidInput,
    check_database,
    db_option,
    db_url_param,
    echo_json,
    first_line,
    human_duration,
    json_option,
    open_store,
    render_table,
    safe_url,
)
from falcon_ray.clock import SYSTEM
from falcon_ray.config import SettingsError, load_settings
from falcon_ray.model import Cluster
from falcon_ray.render import ZONE_RE
from falcon_ray.spec import SpecError, parse_spec
from falcon_ray.store import Store, Task, migrate
from falcon_ray.store.registry import CLUSTER_STATUSES

STATUS_LIMIT = 50
TABLE_MESSAGE_WIDTH = 60


# --- the group -------------------------------------------------------------------------


class _Main(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SettingsError as e:  # a bad --config file is bad input
            raise InvalidInput(str(e)) from None
        except sa.exc.SQLAlchemyError as e:  # never a traceback for a database problem
            raise CliError(f"database error: {first_line(e)}") from None


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Falcon-Ray: TPU tasks from a MySQL jobs table to node pools and Kubernetes Jobs on GKE."""


# --- db ----------------------------------------------------------------------------------


@main.group()
def db() -> None:
    """Database schema."""


@db.command("upgrade")
@db_option
@click.option(
    "--with-jobs-table",
    is_flag=True,
    help="Also create the reference jobs table (demo and tests; in production the upper layer owns it).",
)
@json_option
def db_upgrade(db_url: str, with_jobs_table: bool, as_json: bool) -> None:
    """Create or update Falcon's tables (running it again is a no-op)."""
    try:
        applied = migrate.upgrade(db_url, with_jobs_table=with_jobs_table)
    except RuntimeError as e:  # a revision refusing to run, e.g. over an existing jobs table
        raise CliError(str(e)) from None
    current = migrate.current(db_url)
    if as_json:
        echo_json({"database": safe_url(db_url), "applied": applied, "current": current})
    elif applied:
        click.echo(f"{safe_url(db_url)}: applied {', '.join(applied)}")
    else:
        click.echo(f"{safe_url(db_url)}: already up to date ({', '.join(current)})")


# --- clusters ----------------------------------------------------------------------------

CLUSTER_COLUMNS = [
    ("name", "NAME"),
    ("tpu_type", "TPU"),
    ("status", "STATUS"),
    ("project", "PROJECT"),
    ("location", "LOCATION"),
    ("zone", "ZONE"),
    ("default_reservation", "RESERVATION"),
    ("gcs_bucket", "BUCKET"),
    ("namespace", "NAMESPACE"),
    ("service_account", "SERVICE ACCOUNT"),
]


# the reservation ledger as the ClusterActor last wrote it on the cluster row
LEDGER_COLUMNS = [
    ("reservation_machine_type", "HOLDS"),
    ("reservation_count", "COUNT"),
    ("reservation_in_use", "IN-USE"),
    ("reservation_claimed", "CLAIMED"),
    ("reservation_free", "FREE"),
]
LIST_COLUMNS = [*CLUSTER_COLUMNS[:7], *LEDGER_COLUMNS, *CLUSTER_COLUMNS[7:]]


def _with_ledger(row: dict[str, Any]) -> dict[str, Any]:
    """A cluster row with ``reservation_free``: count - in use - claimed by Falcon (None until read)."""
    count, used, claimed = row.get("reservation_count"), row.get("reservation_in_use"), row.get("reservation_claimed")
    free = None if count is None else max(0, count - (used or 0) - (claimed or 0))
    return {**row, "reservation_free": free}


@main.group()
def clusters() -> None:
    """The edge-cluster registry."""


def _tpu_type(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if value not in tpu.tpu_types():
        raise click.BadParameter(f"unknown TPU type {value!r}; allowed: {', '.join(tpu.tpu_types())}")
    return value


@clusters.command("add")
@click.argument("name")
@click.option("--project", required=True, help="GCP project of the cluster.")
@click.option("--location", required=True, help="GKE location (zone or region).")
@click.option("--tpu-type", required=True, callback=_tpu_type, help=f"One of {', '.join(tpu.tpu_types())}.")
@click.option("--gcs-bucket", default="", help="Bucket for the Jobs' logs.")
@click.option("--reservation", default="", callback=lambda c, p, v: _reservation(v), help="Default reservation: NAME (the cluster's project, read in its zone), ZONE/NAME, projects/PROJECT/reservations/NAME (shared from PROJECT) or projects/PROJECT/zones/ZONE/reservations/NAME (empty: flex-start by default).")
@click.option("--status", type=click.Choice(CLUSTER_STATUSES), default="active", show_default=True)
@click.option("--namespace", default="falcon-jobs", show_default=True, help="Namespace the Jobs run in.")
@click.option("--service-account", default="falcon-job", show_default=True, help="Kubernetes SA the Jobs run as.")
@click.option("--zone", default="", callback=lambda c, p, v: _zone(v), help="Zone for pools without a reservation (regional clusters; empty: the cluster's zone, else its first node location).")
@db_option
@json_option
def clusters_add(
    name: str,
    project: str,
    location: str,
    tpu_type: str,
    gcs_bucket: str,
    reservation: str,
    status: str,
    namespace: str,
    service_account: str,
    zone: str,
    db_url: str,
    as_json: bool,
) -> None:
    """Register an edge cluster."""
    if not name or len(name) > 63:
        raise click.BadParameter("a cluster name has 1 to 63 characters", param_hint="NAME")
    with open_store(db_url, need_jobs=False) as store:
        if store.get_cluster(name) is not None:
            raise CliError(f"cluster {name!r} already exists")
        try:
            cluster = store.add_cluster(
                name,
                project,
                location,
                tpu_type,
                gcs_bucket=gcs_bucket,
                default_reservation=reservation,
                status=status,
                namespace=namespace,
                service_account=service_account,
                zone=zone,
            )
        except sa.exc.IntegrityError:
            raise CliError(f"cluster {name!r} already exists") from None
    if as_json:
        echo_json(cluster.to_dict())
    else:
        click.echo(render_table([cluster.to_dict()], CLUSTER_COLUMNS))


@clusters.command("list")
@db_option
@json_option
def clusters_list(db_url: str, as_json: bool) -> None:
    """List the registered clusters, with each reservation's ledger: the machine type it
    holds, count, in use (GKE), claimed by Falcon's pools (not yet in use), free. The
    figures are the ClusterActor's last reading ("-": not read yet)."""
    with open_store(db_url, need_jobs=False) as store:
        rows = [_with_ledger(c.to_dict()) for c in store.list_clusters()]
    if as_json:
        echo_json(rows)
    elif rows:
        click.echo(render_table(rows, LIST_COLUMNS))
    else:
        click.echo("no clusters registered (falcon-ray clusters add ...)")


@clusters.command("set-status")
@click.argument("name")
@click.argument("status", type=click.Choice(CLUSTER_STATUSES))
@db_option
@json_option
def clusters_set_status(name: str, status: str, db_url: str, as_json: bool) -> None:
    """Put a cluster in service (active) or take it out (maintenance, offline)."""
    with open_store(db_url, need_jobs=False) as store:
        before = store.get_cluster(name)
        if before is None or not store.set_cluster_status(before.name, status):
            raise CliError(f"no cluster named {name!r}")
        after = store.get_cluster(before.name)
    if as_json:
        echo_json(after.to_dict())
    else:
        click.echo(f"{after.name}: {before.status} -> {after.status}")


def _reservation(value: str) -> str:
    """A registry reservation in one of the accepted forms (else exit 2), stripped."""
    if not value:
        return ""
    try:
        render.parse_reservation(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    return value.strip()


def _zone(value: str) -> str:
    if value and not ZONE_RE.match(value):
        raise click.BadParameter(f"{value!r} is not a zone (like us-central1-c)")
    return value


@clusters.command("set-zone")
@click.argument("name")
@click.argument("zone")
@db_option
@json_option
def clusters_set_zone(name: str, zone: str, db_url: str, as_json: bool) -> None:
    """Choose the zone of new pools without a reservation on a regional cluster ("" clears it)."""
    zone = _zone(zone)
    with open_store(db_url, need_jobs=False) as store:
        before = store.get_cluster(name)
        if before is None or not store.set_cluster_zone(before.name, zone):
            raise CliError(f"no cluster named {name!r}")
        after = store.get_cluster(before.name)
    if as_json:
        echo_json(after.to_dict())
    else:
        click.echo(f"{after.name}: zone {before.zone or '-'} -> {after.zone or '-'}")


# --- tasks -------------------------------------------------------------------------------


def _env_pairs(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.BadParameter(f"expected NAME=VALUE, got {item!r}")
        env[key] = value
    return env


@main.command(context_settings={"allow_interspersed_args": False})
@click.option("--actor", required=True, help="Who submits (the fairness key).")
@click.option("--name", default="", help="A name for the task.")
@click.option("--tpu-type", required=True, help=f"One of {', '.join(tpu.tpu_types())}.")
@click.option("--topology", required=True, help="Slice topology, e.g. 2x4 (v6e) or 2x2x2 (v7x).")
@click.option("--image", required=True, help="Container image.")
@click.option("--supply-mode", default=None, help="reservation, on-demand or flex-start (default: the cluster's).")
@click.option("--timeout", "timeout_seconds", type=int, default=None, help="Run-time limit in seconds.")
@click.option("--env", "env", multiple=True, callback=_env_pairs, metavar="NAME=VALUE", help="Repeatable.")
@click.option("--priority", type=click.IntRange(-100, 100), default=None, help="Higher goes first (default 0).")
@click.option("--cpu", default=None, help="CPU request, e.g. 8 or 500m.")
@click.option("--memory", default=None, help="Memory request, e.g. 64Gi.")
@click.option("--working-dir", default=None, help="Absolute working directory in the container.")
@db_option
@json_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def submit(
    actor: str,
    name: str,
    tpu_type: str,
    topology: str,
    image: str,
    supply_mode: str | None,
    timeout_seconds: int | None,
    env: dict[str, str],
    priority: int | None,
    cpu: str | None,
    memory: str | None,
    working_dir: str | None,
    db_url: str,
    as_json: bool,
    command: tuple[str, ...],
) -> None:
    """Write a Pending task as the upper layer would; prints its id.

    Options come first, then the command: falcon-ray submit --actor a ... -- python train.py
    """
    spec: dict[str, Any] = {"tpu_type": tpu_type, "topology": topology, "image": image, "command": list(command)}
    optional = {
        "supply_mode": supply_mode,
        "timeout_seconds": timeout_seconds,
        "env": env or None,
        "priority": priority,
        "cpu": cpu,
        "memory": memory,
        "working_dir": working_dir,
    }
    spec.update({k: v for k, v in optional.items() if v is not None})
    try:
        parsed = parse_spec(spec)
    except SpecError as e:
        raise InvalidInput(f"invalid task spec: {e}") from None
    with open_store(db_url) as store:
        task_id = store.submit_task(
            actor,
            spec,
            name=name,
            timeout_seconds=parsed.timeout_seconds if timeout_seconds is not None else None,
        )
    if as_json:
        echo_json({"id": task_id})
    else:
        click.echo(task_id)


@main.command()
@click.argument("task_id", type=click.IntRange(1, 2**63 - 1))
@db_option
@json_option
def abort(task_id: int, db_url: str, as_json: bool) -> None:
    """Ask Falcon to abort a task (sets Aborting, as the upper layer does)."""
    with open_store(db_url) as store:
        task = store.get_task(task_id)
        if task is None:
            raise CliError(f"task {task_id} not found")
        if task.terminal:
            raise CliError(f"task {task_id} already finished ({task.phase}); nothing to abort")
        if task.status == lc.Status.ABORTING:
            result = {"id": task_id, "status": "Aborting", "previous": "Aborting", "changed": False}
        elif store.request_abort(task_id):
            result = {"id": task_id, "status": "Aborting", "previous": str(task.phase), "changed": True}
        else:  # it moved meanwhile: report what it is now
            now = store.get_task(task_id)
            if now.terminal:
                raise CliError(f"task {task_id} finished meanwhile ({now.phase}); nothing to abort")
            result = {"id": task_id, "status": now.status, "previous": str(task.phase), "changed": False}
    if as_json:
        echo_json(result)
    elif result["changed"]:
        click.echo(f"task {task_id}: {result['previous']} -> Aborting (Falcon deletes the Job and the pool)")
    else:
        click.echo(f"task {task_id} is already being aborted")


TASK_COLUMNS = [
    ("id", "ID"),
    ("name", "NAME"),
    ("actor", "ACTOR"),
    ("status", "STATUS"),
    ("reason", "REASON"),
    ("cluster_name", "CLUSTER"),
    ("node_pool_name", "NODE POOL"),
    ("created_at", "CREATED"),
    ("dispatched_at", "DISPATCHED"),
    ("finished_at", "FINISHED"),
    ("message", "MESSAGE"),
]


def _task_row(task: Task, cluster_names: dict[str, str]) -> dict[str, Any]:
    row = task.to_dict()
    row["reason"] = task.phase.reason.value  # a reason left behind by an abort is not shown
    row["cluster_name"] = cluster_names.get(task.cluster_id or "", task.cluster_id)
    return row


def _timeline(store: Store, task: Task) -> list[dict[str, Any]]:
    events = store.events(task.id)
    now = store.clock()
    steps = []
    for i, e in enumerate(events):
        ended = events[i + 1].at if i + 1 < len(events) else (None if task.terminal else now)
        steps.append(
            {
                "at": e.at,
                "status": e.status,
                "reason": e.reason,
                "step": str(lc.Phase(lc.Status(e.status), lc.Reason(e.reason))),
                "message": e.message,
                "seconds": None if ended is None else round((ended - e.at).total_seconds(), 3),
                "ongoing": ended is not None and i + 1 == len(events),
                "epoch": e.epoch,  # the writer's leader epoch (None: the upper layer)
            }
        )
    return steps


def _print_timeline(task: Task, cluster_name: str | None, steps: list[dict[str, Any]]) -> None:
    title = f"task {task.id}"
    if task.name:
        title += f" {task.name!r}"
    title += f" by {task.actor}: {task.phase}"
    if cluster_name:
        title += f" on {cluster_name}"
    if task.node_pool_name:
        title += f" (node pool {task.node_pool_name})"
    click.echo(title)
    rows = []
    for s in steps:
        spent = "-" if s["seconds"] is None else human_duration(s["seconds"])
        rows.append(
            {
                "at": s["at"].strftime("%Y-%m-%d %H:%M:%S.") + f"{s['at'].microsecond // 1000:03d}",
                "step": s["step"],
                "spent": spent + (" so far" if s["ongoing"] else ""),
                "message": s["message"],
            }
        )
    click.echo(render_table(rows, [("at", "TIME (UTC)"), ("step", "STEP"), ("spent", "SPENT"), ("message", "MESSAGE")]))
    if steps:
        end = task.finished_at if task.terminal and task.finished_at else None
        total = ((end or steps[-1]["at"]) - steps[0]["at"]).total_seconds()
        if not task.terminal:
            total += steps[-1]["seconds"] or 0.0
        click.echo(f"total: {human_duration(total)}{'' if task.terminal else ' so far'}")


@main.command()
@click.argument("task_ids", nargs=-1, type=click.IntRange(1, 2**63 - 1))
@click.option("--events", is_flag=True, help="Show the event timeline of one task.")
@click.option("--limit", default=STATUS_LIMIT, show_default=True, type=click.IntRange(1, 100_000), help="How many recent tasks without ids.")
@db_option
@json_option
def status(task_ids: tuple[int, ...], events: bool, limit: int, db_url: str, as_json: bool) -> None:
    """Show tasks (the most recent ones without ids), or one task's timeline with --events."""
    if events and len(task_ids) != 1:
        raise click.UsageError("--events takes exactly one task id")
    with open_store(db_url) as store:
        names = {c.id: c.name for c in store.list_clusters()}
        tasks = store.get_tasks(task_ids) if task_ids else store.recent_tasks(limit)
        found = {t.id for t in tasks}
        missing = [i for i in dict.fromkeys(task_ids) if i not in found]
        if events and tasks:
            steps = _timeline(store, tasks[0])
    if events and tasks:
        task = tasks[0]
        if as_json:
            echo_json({"task": _task_row(task, names), "events": steps})
        else:
            _print_timeline(task, names.get(task.cluster_id or "", task.cluster_id), steps)
    else:
        rows = [_task_row(t, names) for t in tasks]
        if task_ids:
            order = {i: n for n, i in enumerate(task_ids)}
            rows.sort(key=lambda r: order[r["id"]])
        if as_json:
            echo_json(rows)
        elif rows:
            click.echo(render_table(rows, TASK_COLUMNS, widths={"message": TABLE_MESSAGE_WIDTH}))
        elif not task_ids:
            click.echo("no tasks")
    if missing:
        raise CliError(f"not found: task {', '.join(str(i) for i in missing)}")


# --- render: what Falcon would send, for one cluster and one spec --------------------------


def _spec_text(value: str) -> str:
    if value.startswith("@"):
        try:
            return Path(value[1:]).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidInput(f"cannot read spec file {value[1:]!r}: {first_line(e)}") from None
    return value


@main.command("render")
@click.option("--project", required=True, help="GCP project of the cluster.")
@click.option("--location", required=True, help="GKE location (zone or region).")
@click.option("--tpu-type", required=True, help=f"One of {', '.join(tpu.tpu_types())}.")
@click.option("--reservation", default="", help="Default reservation, as for clusters add.")
@click.option("--gcs-bucket", default="", help="Bucket for the Jobs' logs.")
@click.option("--zone", default="", help="Zone of pools without a reservation zone (regional clusters).")
@click.option("--cluster", "cluster_name", default="edge", show_default=True, help="Cluster name (queue label).")
@click.option("--namespace", default="falcon-jobs", show_default=True, help="Namespace the Jobs run in.")
@click.option("--service-account", default="falcon-job", show_default=True, help="Kubernetes SA the Jobs run as.")
@click.option("--spec", "spec_arg", required=True, metavar="JSON|@FILE", help="The task spec, as in the jobs table.")
@click.option("--task-id", type=click.IntRange(1, 2**63 - 1), default=1, show_default=True)
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None, help="Settings YAML (scopes, idle times, workload policy).")
@click.option("--json", "as_json", is_flag=True, help='Print {"node_pool", "job", "service"} as JSON.')
def render_cmd(
    project: str,
    location: str,
    tpu_type: str,
    reservation: str,
    gcs_bucket: str,
    zone: str,
    cluster_name: str,
    namespace: str,
    service_account: str,
    spec_arg: str,
    task_id: int,
    config_path: str | None,
    as_json: bool,
) -> None:
    """Print what Falcon would send for one task on one cluster, changing nothing: the
    node-pool create (GKE REST JSON), the Job and the headless Service (multi-host). The
    supply mode is chosen as the controller would. No database, no cloud call: a reservation
    given as NAME on a regional cluster needs --zone (the controller finds its zone through
    Compute)."""
    settings = load_settings(config_path)
    spec, reservation, zone = _render_input(tpu_type, reservation, zone, spec_arg)
    now = SYSTEM.now()  # a command: the machine's clock
    cluster = Cluster(
        id=cluster_name, name=cluster_name, project=project, location=location, tpu_type=tpu_type,
        gcs_bucket=gcs_bucket, default_reservation=reservation, status="active", namespace=namespace,
        service_account=service_account, created_at=now, updated_at=now, zone=zone,
    )
    mode, out = _rendered(spec, cluster, task_id, settings)
    if as_json:
        echo_json(out)
    else:
        _print_rendered(out, mode, f"projects/{project}/locations/{location}/clusters/{cluster_name}", namespace)


def _render_input(tpu_type: str, reservation: str, zone: str, spec_arg: str) -> tuple[Any, str, str]:
    """render's input checked: (the parsed spec, the reservation, the zone); bad input is
    one line and exit 2 (click's own errors would add the usage)."""
    try:
        _tpu_type(None, None, tpu_type)  # type: ignore[arg-type]
        reservation, zone = _reservation(reservation), _zone(zone)
    except click.BadParameter as e:
        raise InvalidInput(e.format_message()) from None
    try:
        spec = parse_spec(_spec_text(spec_arg))
    except SpecError as e:
        raise InvalidInput(f"invalid task spec: {e}") from None
    if spec.tpu_type != tpu_type:
        raise InvalidInput(f"the spec asks for TPU type {spec.tpu_type}; the cluster offers {tpu_type}")
    return spec, reservation, zone


def _rendered(spec: Any, cluster: Cluster, task_id: int, settings: Any) -> tuple[Any, dict[str, Any]]:
    """The supply mode the controller would choose and what it would send: (mode,
    {"node_pool", "job", "service"}); a task the controller would not place is exit 2."""
    offer = scheduling.offer(spec, cluster)
    if not offer.serves:
        raise InvalidInput(f"the controller would not place this task on {cluster.name}: {_unfit_text(offer, spec)}")
    mode = offer.mode
    pool = render.node_pool_name(task_id, spec.topology)
    try:
        request = render.node_pool_request(
            spec, cluster, mode, pool, task_id,
            idle_seconds=settings.idle_seconds(mode),
            workload_policy=settings.workload_policy(spec.topology) if spec.tpu_type == "v7x" else None,
            installation=settings.installation,
            zone=cluster.zone or None,
            oauth_scopes=settings.node_oauth_scopes,
            service_account=settings.node_service_account,
        )
    except ValueError as e:
        raise InvalidInput(str(e)) from None
    job = render.job_manifest(task_id, spec, cluster, pool, render.queue_label(cluster.name, spec.topology), settings.installation)
    service = render.headless_service(task_id, spec, cluster, settings.installation) if spec.shape.multi_host else None
    return mode, {"node_pool": request, "job": job, "service": service}


def _print_rendered(out: dict[str, Any], mode: Any, parent: str, namespace: str) -> None:
    """render's text form: each request as YAML under a heading naming where it goes."""
    click.echo(f"# supply mode: {mode.value}")
    click.echo(f"# node pool: POST https://container.googleapis.com/v1/{parent}/nodePools  {{\"nodePool\": ...}}")
    click.echo(yaml.safe_dump(out["node_pool"], sort_keys=False, allow_unicode=True).rstrip())
    click.echo(f"# job: POST /apis/batch/v1/namespaces/{namespace}/jobs")
    click.echo(yaml.safe_dump(out["job"], sort_keys=False, allow_unicode=True).rstrip())
    if out["service"] is None:
        click.echo("# service: none (single-host slice)")
    else:
        click.echo(f"# service: POST /api/v1/namespaces/{namespace}/services")
        click.echo(yaml.safe_dump(out["service"], sort_keys=False, allow_unicode=True).rstrip())


def _unfit_text(offer: scheduling.Offer, spec: Any) -> str:
    if offer.unfit == scheduling.Unfit.NO_RESERVATION:
        return "the task asks for reservation supply and no --reservation is given"
    if offer.unfit == scheduling.Unfit.RESERVATION_SIZE:
        return f"reservation {offer.reservation} holds {offer.count} VM(s), fewer than the {spec.shape.hosts} a {spec.topology} slice needs"
    if offer.unfit == scheduling.Unfit.FLEX_START_MAX_RUN:
        return (
            f"flex-start VMs run at most {render.FLEX_START_MAX_RUN_SECONDS // 86400} days (maxRunDuration), "
            f"shorter than the task's timeout_seconds {spec.timeout_seconds}"
        )
    return f"{offer.unfit}"


# --- commands from other modules ----------------------------------------------------------

for _command in controller_cli.COMMANDS:
    main.add_command(_command)

# The development tools' module, loaded by name: the product never imports the tools (the
# import contracts in pyproject.toml), and the production image is built without them.
DEVTOOLS_COMMANDS = "falcon_ray.devtools.commands"
# what an image without the tools answers for them
TOOL_COMMAND_NAMES = ("demo", "chaos", "bench", "sim", "simulate")


def _tool_not_installed(name: str) -> click.Command:
    """A hidden stand-in for a tool command: one line saying the tools are absent, exit 1."""

    def refuse() -> None:
        raise CliError(
            f"`falcon-ray {name}` is a development tool, and the development tools "
            "(falcon_ray.devtools) are not installed in this image; run it from a source "
            "checkout (pip install -e .)"
        )

    return click.Command(
        name, callback=refuse, hidden=True, add_help_option=False,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        help="Not installed in this image (a development tool).",
    )


def register_tools(group: click.Group) -> bool:
    """Attach the development tools' commands when their package is installed (True), else
    their stand-ins (False)."""
    try:
        tools = importlib.import_module(DEVTOOLS_COMMANDS)
    except ModuleNotFoundError as e:
        if e.name not in ("falcon_ray.devtools", DEVTOOLS_COMMANDS):
            raise  # a tool is installed but one of its own imports is missing
        for name in TOOL_COMMAND_NAMES:
            group.add_command(_tool_not_installed(name))
        return False
    tools.register(group)
    return True


register_tools(main)
