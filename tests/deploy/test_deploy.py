"""The deployment files agree with the code they deploy.

Fast and offline: YAML parses, core Kubernetes kinds validate (kubernetes-validate's
bundled schemas, strict), the RayCluster and PodMonitor are checked for what KubeRay and
the Prometheus Operator need, the kustomizations build (``kubectl kustomize`` when a
kubectl with a modern kustomize is on PATH, and always a small resolver of our own), and
every name the manifests share with the code is the code's: the ``falcon-ray`` command
and its options, the Settings file, the health endpoints and port, the Secret keys, the
ServiceAccount, the Ray version, the IAM permissions for every client call in
``falcon_ray/gcp.py`` and ``falcon_ray/kube.py``, and every metric on the dashboard.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import kubernetes_validate
import pytest
import ray
import yaml
from click.testing import CliRunner

from falcon_ray import health, metrics
from falcon_ray.cli import main as cli_main
from falcon_ray.config import Settings, load_settings

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUBERAY = DEPLOY / "kuberay"
KUBERAY_GSA = DEPLOY / "kuberay-gsa"
KUBERAY_WORKERS = DEPLOY / "kuberay-workers"
DB_UPGRADE = KUBERAY / "db-upgrade"
KUSTOMIZATIONS = (KUBERAY, KUBERAY_GSA, KUBERAY_WORKERS, DB_UPGRADE)
ROLE_FILE = DEPLOY / "iam" / "falcon-controller-role.yaml"
PRINT_GCLOUD = DEPLOY / "iam" / "print-gcloud.sh"
DASHBOARD = DEPLOY / "grafana" / "falcon-dashboard.json"
DOCKERFILE = DEPLOY / "Dockerfile"

# The Kubernetes version the core kinds are validated against (a bundled schema of
# kubernetes-validate; GKE's stable channel is at or above it).
K8S_VERSION = "1.32"
CORE_KINDS = {"Namespace", "ServiceAccount", "ConfigMap", "Service", "Secret", "NetworkPolicy", "Job"}
CLUSTER_SCOPED = {"Namespace"}
CONTROLLER = "falcon-controller"
RAY_CONTAINER = "ray-head"


# --- loading -------------------------------------------------------------------------------


def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


def docs_of(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def one(path: Path) -> dict[str, Any]:
    docs = docs_of(path)
    assert len(docs) == 1, f"{path}: expected one document, found {len(docs)}"
    return docs[0]


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def kube_objects() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in yaml_files():
        for doc in docs_of(path):
            if "apiVersion" in doc and "kind" in doc and doc["kind"] != "Kustomization":
                yield path, doc


def raycluster() -> dict[str, Any]:
    return one(KUBERAY / "raycluster.yaml")


def head_spec() -> dict[str, Any]:
    return raycluster()["spec"]["headGroupSpec"]


def container(name: str) -> dict[str, Any]:
    found = [c for c in head_spec()["template"]["spec"]["containers"] if c["name"] == name]
    assert len(found) == 1, f"head pod must have exactly one {name!r} container"
    return found[0]


def env_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}


def named_port(c: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", []) if "name" in p}
    assert port in ports, f"container {c['name']} has no port named {port!r}"
    return ports[port]


def volume(name: str) -> dict[str, Any]:
    vols = {v["name"]: v for v in head_spec()["template"]["spec"]["volumes"]}
    assert name in vols, f"head pod has no volume {name!r}"
    return vols[name]


def mount_path(c: dict[str, Any], volume_name: str) -> str:
    mounts = [m for m in c.get("volumeMounts", []) if m["name"] == volume_name]
    assert len(mounts) == 1, f"container {c['name']} does not mount {volume_name!r} once"
    return mounts[0]["mountPath"]


# --- the falcon-ray command line -------------------------------------------------------------


def resolve_cli(argv: list[str]) -> tuple[click.Command, list[str], list[str]]:
    """Walk ``falcon-ray ARGV`` down the click groups: (command, its path, the rest)."""
    assert argv and argv[0] == "falcon-ray", argv
    cmd: click.Command = cli_main
    path = ["falcon-ray"]
    rest = list(argv[1:])
    while isinstance(cmd, click.Group) and rest and not rest[0].startswith("-"):
        sub = cmd.commands.get(rest[0])
        assert sub is not None, f"`{' '.join(path)}` has no command {rest[0]!r}"
        cmd, path, rest = sub, [*path, rest[0]], rest[1:]
    return cmd, path, rest


def check_options(cmd: click.Command, path: list[str], rest: list[str]) -> dict[str, str | None]:
    """Every ``--option`` in ``rest`` exists on ``cmd``; returns {option: value}."""
    opts: dict[str, click.Option] = {}
    for p in cmd.params:
        if isinstance(p, click.Option):
            for o in (*p.opts, *p.secondary_opts):
                opts[o] = p
    for h in cmd.context_settings.get("help_option_names", ["--help"]) + ["-h", "--help"]:
        opts.setdefault(h, None)  # type: ignore[arg-type]
    seen: dict[str, str | None] = {}
    i = 0
    while i < len(rest):
        tok = rest[i]
        if tok == "--":
            break
        if tok.startswith("-"):
            name, eq, inline = tok.partition("=")
            assert name in opts, f"`{' '.join(path)}` has no option {name} (has: {', '.join(sorted(opts))})"
            p = opts[name]
            if p is not None and not p.is_flag and not eq:
                assert i + 1 < len(rest), f"`{' '.join(path)} {name}` needs a value"
                seen[name] = rest[i + 1]
                i += 1
            else:
                seen[name] = inline if eq else None
        i += 1
    return seen


# --- YAML and schemas ------------------------------------------------------------------------


def test_every_yaml_file_in_deploy_parses_into_known_documents():
    files = yaml_files()
    assert files, "no YAML under deploy/"
    for path in files:
        docs = docs_of(path)
        assert docs, f"{rel(path)} is empty"
        for doc in docs:
            assert isinstance(doc, dict), f"{rel(path)}: a document is not a mapping"
            known = ("apiVersion" in doc and "kind" in doc) or "includedPermissions" in doc
            assert known, f"{rel(path)}: neither a Kubernetes object, a Kustomization nor an IAM role"


def test_core_kinds_validate_strictly_against_the_bundled_kubernetes_schema():
    assert K8S_VERSION in {
        kubernetes_validate.utils.major_minor(v) for v in kubernetes_validate.utils.all_versions()
    }
    checked: set[str] = set()
    for path, doc in kube_objects():
        if doc["kind"] not in CORE_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(
                f"{rel(path)} {doc['kind']}/{doc['metadata']['name']}: {'.'.join(map(str, e.path))}: {e.message}"
            )
        checked.add(doc["kind"])
    assert {"Namespace", "ServiceAccount", "ConfigMap", "Secret", "NetworkPolicy", "Job"} <= checked


def test_the_head_pod_template_is_a_valid_pod():
    template = head_spec()["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "falcon-head", "namespace": "falcon", **template.get("metadata", {})},
        "spec": template["spec"],
    }
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


# --- the RayCluster --------------------------------------------------------------------------


def test_raycluster_has_what_kuberay_requires_and_no_workers():
    rc = raycluster()
    assert rc["apiVersion"] == "ray.io/v1" and rc["kind"] == "RayCluster"
    assert rc["metadata"]["name"] == "falcon"
    spec = rc["spec"]
    assert spec["enableInTreeAutoscaling"] is False
    assert spec["upgradeStrategy"]["type"] in ("Recreate", "None")
    # No worker group (or only empty ones): the actors reserve no CPU and run on the head.
    for group in spec.get("workerGroupSpecs", []):
        assert group.get("replicas", 0) == 0 and group.get("maxReplicas", 0) == 0
    head = spec["headGroupSpec"]
    params = head["rayStartParams"]
    assert all(isinstance(v, str) for v in params.values()), "rayStartParams values must be strings"
    assert params["num-cpus"] == "0"
    assert params["metrics-export-port"] == "8080"
    containers = head["template"]["spec"]["containers"]
    assert containers[0]["name"] == RAY_CONTAINER, "KubeRay treats the first container as Ray's"
    assert [c["name"] for c in containers] == [RAY_CONTAINER, CONTROLLER]
    for c in containers:
        assert c["image"] == "falcon-ray", "both containers run the one image (set in kustomization.yaml)"
        res = c["resources"]
        assert set(res) == {"requests", "limits"} and {"cpu", "memory"} <= set(res["requests"])
        assert {"cpu", "memory"} <= set(res["limits"])


def test_the_actors_reserve_no_cpu_so_a_zero_cpu_head_can_host_them():
    from actors import names

    opts = names.options("poller", Settings().namespace, 1)
    assert opts["num_cpus"] == 0
    assert head_spec()["rayStartParams"]["num-cpus"] == "0"


def test_ray_versions_agree_between_pyproject_dockerfile_raycluster_and_the_installed_ray():
    pyproject = (REPO / "pyproject.toml").read_text()
    m = re.search(r'"ray\[default\]>=(\d+)\.(\d+),<(\d+)\.(\d+)"', pyproject)
    assert m, "pyproject pins ray[default] as >=X.Y,<X.Y+1"
    line = f"{m.group(1)}.{m.group(2)}"
    assert ray.__version__.startswith(line + ".")
    from_line = re.search(
        r"^ARG RAY_IMAGE=rayproject/ray:(\d+\.\d+\.\d+)-py(\d)(\d+)\s*$", DOCKERFILE.read_text(), re.M
    )
    assert from_line, "deploy/Dockerfile: ARG RAY_IMAGE=rayproject/ray:X.Y.Z-pyNN"
    assert from_line.group(1).startswith(line + "."), "the image's Ray is not pyproject's Ray line"
    image_py = (int(from_line.group(2)), int(from_line.group(3)))
    requires = re.search(r'requires-python\s*=\s*">=(\d+)\.(\d+)"', pyproject)
    assert requires and image_py >= (int(requires.group(1)), int(requires.group(2)))
    assert image_py == (3, 11), "the image's Python is the one this project is tested on"
    assert raycluster()["spec"]["rayVersion"] == from_line.group(1)


def test_the_dockerfile_installs_this_package_from_the_files_it_copies():
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM \$\{RAY_IMAGE\}\s*$", text, re.M)
    copied = set()
    for m in re.finditer(r"^COPY (?:--chown=\S+ )?(.+) (\S+)$", text, re.M):
        copied.update(m.group(1).split())
    assert {"pyproject.toml", "README.md", "falcon_ray", "actors"} <= copied
    for name in copied:
        assert (REPO / name).exists(), f"the Dockerfile copies {name}, which the repository lacks"
    assert re.search(r"pip install --no-cache-dir /home/ray/falcon-ray-src\b", text)
    assert "-e " not in text, "install the package, not an editable checkout"
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().split()
    assert "*" in ignore and {f"!{n}" for n in copied} <= set(ignore)


def test_controller_command_is_a_real_falcon_ray_run_with_real_options():
    command = container(CONTROLLER)["command"]
    cmd, path, rest = resolve_cli(command)
    assert path == ["falcon-ray", "run"]
    given = check_options(cmd, path, rest)
    assert given["--ray-address"] == "127.0.0.1:6379", "the head's GCS, over the pod's loopback"
    gcs_port = named_port(container(RAY_CONTAINER), "gcs-server")
    assert given["--ray-address"].rsplit(":", 1)[1] == str(gcs_port)
    # The settings file is the ConfigMap's config.yaml where it is mounted.
    cfg_mount = mount_path(container(CONTROLLER), "falcon-config")
    items = volume("falcon-config")["configMap"]["items"]
    assert {"key": "config.yaml", "path": "config.yaml"} in items
    assert given["--config"] == f"{cfg_mount}/config.yaml"
    # The help of `run` lists exactly these options (the brief's check, through click).
    result = CliRunner().invoke(cli_main, ["run", "--help"])
    assert result.exit_code == 0, result.output
    for option in given:
        assert option in result.output


DB_MOUNT = "/etc/falcon-db"


def db_secret_mount(c: dict[str, Any], pod: dict[str, Any]) -> str:
    """Where ``c`` mounts the falcon-db Secret (its key ``url`` as a file), checked read-only."""
    (vol,) = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == "falcon-db"]
    assert vol["secret"]["items"] == [{"key": "url", "path": "url"}]
    assert vol["secret"]["defaultMode"] & 0o007 == 0, "not world-readable"
    (m,) = [m for m in c.get("volumeMounts", []) if m["name"] == vol["name"]]
    assert m.get("readOnly") is True
    return m["mountPath"]


def test_the_database_url_is_a_mounted_file_in_every_ray_container_and_never_an_env_of_ray():
    """The actors resolve file:/etc/falcon-db/url in the Ray containers (falcon_ray.dbref);
    `falcon-ray run` reads FALCON_DB_URL_FILE and hands them that reference."""
    pod = head_spec()["template"]["spec"]
    ctl = container(CONTROLLER)
    env = env_of(ctl)
    assert env["FALCON_DB_URL_FILE"]["value"] == f"{DB_MOUNT}/url"
    assert "FALCON_DB_URL" not in env, "the driver reads the file too"
    for name in (RAY_CONTAINER, CONTROLLER):
        assert db_secret_mount(container(name), pod) == DB_MOUNT, name
        assert "FALCON_DB_URL" not in env_of(container(name)), name
    # what `falcon-ray run` gives the actors in this container: the file reference
    from falcon_ray import dbref

    assert dbref.for_controller("mysql+pymysql://u:p@h/db", from_env=False, url_file=f"{DB_MOUNT}/url") == f"file:{DB_MOUNT}/url"
    run = cli_main.commands["run"]
    assert next(p for p in run.params if p.name == "db_url").envvar == "FALCON_DB_URL"
    assert "FALCON_DB_URL_FILE" in CliRunner().invoke(cli_main, ["run", "--help"]).output
    # the db-upgrade Job is no Ray process: the URL from the Secret as its environment
    job = one(DB_UPGRADE / "job.yaml")
    job_env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert job_env["FALCON_DB_URL"]["valueFrom"]["secretKeyRef"] == {"name": "falcon-db", "key": "url"}


def test_both_containers_share_the_ray_auth_token_secret():
    for name in (RAY_CONTAINER, CONTROLLER):
        env = env_of(container(name))
        assert env["RAY_AUTH_MODE"]["value"] == "token"
        assert env["RAY_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"] == {
            "name": "falcon-ray-auth",
            "key": "auth_token",
        }


def test_secret_example_shows_every_secret_the_pods_reference_and_is_not_applied():
    example = {d["metadata"]["name"]: d for d in docs_of(KUBERAY / "secret.example.yaml")}
    refs: set[tuple[str, str]] = set()
    pods = [head_spec()["template"]["spec"], one(DB_UPGRADE / "job.yaml")["spec"]["template"]["spec"]]
    for pod in pods:
        for c in pod["containers"]:
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    refs.add((ref["name"], ref["key"]))
        for v in pod.get("volumes", []):
            if "secret" in v:
                refs |= {(v["secret"]["secretName"], item["key"]) for item in v["secret"]["items"]}
    assert refs == {("falcon-db", "url"), ("falcon-ray-auth", "auth_token"), ("falcon-api-token", "token")}
    for name, key in refs:
        secret = example[name]
        assert secret["kind"] == "Secret" and secret["metadata"]["namespace"] == "falcon"
        assert key in secret["stringData"]
        assert "CHANGE-ME" in secret["stringData"][key], "placeholders only"
    kustomization = one(KUBERAY / "kustomization.yaml")
    assert "secret.example.yaml" not in kustomization["resources"]
    assert not any(d["kind"] == "Secret" for _p, d in kube_objects() if _p.name != "secret.example.yaml")


def test_configmap_config_loads_with_load_settings_and_matches_the_manifests(tmp_path):
    cm = one(KUBERAY / "configmap.yaml")
    assert cm["metadata"]["name"] == "falcon-config"
    assert volume("falcon-config")["configMap"]["name"] == "falcon-config"
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    settings = load_settings(path)  # unknown keys or bad values raise
    raw = yaml.safe_load(cm["data"]["config.yaml"])
    assert raw["health_port"] == 8088 == Settings().health_port == settings.health_port
    assert settings.namespace == Settings().namespace == "falcon"
    # Production-ish: nothing scaled down to the demo's seconds.
    assert settings.node_pool_timeout_s >= Settings().node_pool_timeout_s
    assert settings.leader_ttl_s >= Settings().leader_ttl_s
    assert (
        settings.gke_endpoint is None and settings.compute_endpoint is None and settings.metadata_host is None
    )
    assert settings.kubernetes_scheme == "https"


def test_probes_use_the_health_servers_paths_on_settings_health_port():
    c = container(CONTROLLER)
    port = Settings().health_port
    for probe, path in (
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
        ("startupProbe", "/healthz"),
    ):
        get = c[probe]["httpGet"]
        assert get["path"] == path
        assert named_port(c, get["port"]) == port
        assert c[probe]["timeoutSeconds"] >= 6, "health.check waits up to 5 s for the actors"
    # Ray's metrics port and Falcon's health port never collide.
    assert int(head_spec()["rayStartParams"]["metrics-export-port"]) != port


def test_health_server_answers_the_probe_paths():
    """Serve the real handler on a loopback port with a supervisor stand-in."""

    class Store:
        def ping(self) -> None:
            return None

        def leader(self) -> None:
            return None

        def live_tasks(self) -> list:
            return []

    class Standby:  # a controller waiting for the lease: live, not ready
        holder = "test"
        leader = False
        lease_renewed_at = None
        known: dict = {}
        s = Settings()
        store = Store()

        def actor_names(self) -> list[str]:
            return []

    server = health.serve(Standby(), 0, host="127.0.0.1")
    try:
        port = server.server_address[1]

        def status(path: str) -> int:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
                    return r.status
            except urllib.error.HTTPError as e:
                return e.code

        probes = {
            c_probe: container(CONTROLLER)[c_probe]["httpGet"]["path"]
            for c_probe in ("livenessProbe", "readinessProbe")
        }
        assert status(probes["livenessProbe"]) == 200
        assert status(probes["readinessProbe"]) == 503
        assert status("/nothing-here") == 404
    finally:
        server.shutdown()
        server.server_close()


def test_service_account_namespace_and_workload_identity_variants():
    sa = one(KUBERAY / "serviceaccount.yaml")
    assert sa["metadata"] == {**sa["metadata"], "name": "falcon-controller", "namespace": "falcon"}
    assert "annotations" not in sa["metadata"], "the base uses the direct principal: no GSA annotation"
    text = (KUBERAY / "serviceaccount.yaml").read_text()
    assert (
        "principal://iam.googleapis.com/projects/CENTRAL_PROJECT_NUMBER/locations/global/workloadIdentityPools/"
        "CENTRAL_PROJECT_ID.svc.id.goog/subject/ns/falcon/sa/falcon-controller" in text
    )
    assert head_spec()["template"]["spec"]["serviceAccountName"] == "falcon-controller"
    ns = one(KUBERAY / "namespace.yaml")
    assert ns["metadata"]["name"] == "falcon" == Settings().namespace
    assert one(KUBERAY / "kustomization.yaml")["namespace"] == "falcon"
    patch = one(KUBERAY_GSA / "serviceaccount-gsa.yaml")
    assert patch["metadata"]["name"] == "falcon-controller"
    gsa = patch["metadata"]["annotations"]["iam.gke.io/gcp-service-account"]
    assert re.fullmatch(r"[a-z][a-z0-9-]+@[A-Za-z0-9_-]+\.iam\.gserviceaccount\.com", gsa)


def test_podmonitor_scrapes_rays_metrics_port_on_the_head_pod():
    pm = one(KUBERAY / "podmonitor.yaml")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1" and pm["kind"] == "PodMonitor"
    assert pm["spec"]["selector"]["matchLabels"] == {
        "ray.io/cluster": raycluster()["metadata"]["name"],
        "ray.io/node-type": "head",
    }
    endpoints = pm["spec"]["podMetricsEndpoints"]
    assert len(endpoints) == 1
    ep = endpoints[0]
    assert ep.get("path", "/metrics") == "/metrics"
    assert named_port(container(RAY_CONTAINER), ep["port"]) == int(
        head_spec()["rayStartParams"]["metrics-export-port"]
    )
    for r in ep.get("relabelings", []):
        assert r.get("action", "replace") in ("replace", "keep", "drop", "labelmap", "labeldrop", "labelkeep")


def test_network_policy_leaves_only_the_metrics_and_health_ports_open():
    np = one(KUBERAY / "networkpolicy.yaml")
    assert np["spec"]["podSelector"]["matchLabels"] == {"ray.io/cluster": "falcon"}
    assert np["spec"]["policyTypes"] == ["Ingress"]
    ports = [p["port"] for rule in np["spec"]["ingress"] for p in rule["ports"]]
    assert ports == [int(head_spec()["rayStartParams"]["metrics-export-port"]), Settings().health_port]


def test_the_api_service_reaches_the_controllers_health_port_and_its_token_is_the_mounted_secret(tmp_path):
    """The read API (docs/api.md) is exposed by the Service falcon-api on the head pod's
    health port, and the settings name the file the token Secret is mounted as."""
    svc = one(KUBERAY / "service.yaml")
    assert svc["kind"] == "Service" and svc["metadata"]["name"] == "falcon-api"
    assert svc["spec"]["selector"] == {"ray.io/cluster": raycluster()["metadata"]["name"], "ray.io/node-type": "head"}
    (port,) = svc["spec"]["ports"]
    ctl = container(CONTROLLER)
    assert named_port(ctl, port["targetPort"]) == Settings().health_port == port["port"]
    path = tmp_path / "config.yaml"
    path.write_text(one(KUBERAY / "configmap.yaml")["data"]["config.yaml"])
    token_file = load_settings(path).api_token_file
    assert token_file is not None
    mount = next(m for m in ctl["volumeMounts"] if token_file.startswith(m["mountPath"] + "/"))
    volume = next(v for v in head_spec()["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == "falcon-api-token"
    assert [f"{mount['mountPath']}/{i['path']}" for i in volume["secret"]["items"]] == [token_file]


def test_db_upgrade_job_runs_a_real_falcon_ray_command():
    job = one(DB_UPGRADE / "job.yaml")
    c = job["spec"]["template"]["spec"]["containers"][0]
    cmd, path, rest = resolve_cli(c["command"])
    assert path == ["falcon-ray", "db", "upgrade"]
    check_options(cmd, path, rest)
    assert "--with-jobs-table" not in rest, "in production the upper layer owns the jobs table"


# --- kustomize ----------------------------------------------------------------------------------


def _identity(doc: dict[str, Any]) -> tuple[str, str, str, str]:
    group = doc["apiVersion"].rsplit("/", 1)[0] if "/" in doc["apiVersion"] else ""
    ns = "" if doc["kind"] in CLUSTER_SCOPED else doc["metadata"].get("namespace", "")
    return group, doc["kind"], ns, doc["metadata"]["name"]


def resolve_kustomization(directory: Path, seen: tuple[Path, ...] = ()) -> list[dict[str, Any]]:
    """A minimal kustomize: resources (files and directories), namespace, images,
    strategic-merge patches (maps merged key by key, lists replaced: what kustomize does
    for a custom resource such as the RayCluster, and for the lists our patches of core
    kinds set) and inline JSON patches (add / replace) of one named target. Enough to
    prove every entry exists, parses and lands in the right namespace without duplicates,
    and to check what the overlays change."""
    directory = directory.resolve()
    assert directory not in seen, f"kustomization cycle through {directory}"
    k = one(directory / "kustomization.yaml")
    assert k["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and k["kind"] == "Kustomization"
    objects: list[dict[str, Any]] = []
    for entry in k.get("resources", []):
        target = (directory / entry).resolve()
        assert target.exists(), f"{rel(directory)}/kustomization.yaml: resource {entry} does not exist"
        if target.is_dir():
            objects += resolve_kustomization(target, (*seen, directory))
        else:
            for doc in docs_of(target):
                assert doc.get("kind") != "Kustomization"
                objects.append(doc)
    for patch in k.get("patches", []):
        if "path" not in patch:  # an inline JSON patch of one named target
            target = patch["target"]
            matches = [o for o in objects if (o["kind"], o["metadata"]["name"]) == (target["kind"], target["name"])]
            assert len(matches) == 1, f"{rel(directory)}: a JSON patch targets no single object ({target})"
            for op in yaml.safe_load(patch["patch"]):
                _json_patch(matches[0], op)
            continue
        p = one(directory / patch["path"])
        matches = [
            o for o in objects if (o["kind"], o["metadata"]["name"]) == (p["kind"], p["metadata"]["name"])
        ]
        assert len(matches) == 1, f"{patch['path']} patches no single object"
        for key in ("labels", "annotations"):
            if key in p["metadata"]:
                matches[0]["metadata"].setdefault(key, {}).update(p["metadata"][key])
        for key, value in p.items():
            if key not in ("apiVersion", "kind", "metadata"):
                matches[0][key] = _merge(matches[0].get(key), value)
    if "namespace" in k:
        for o in objects:
            if o["kind"] not in CLUSTER_SCOPED:
                assert o["metadata"].get("namespace", k["namespace"]) == k["namespace"], (
                    f"{o['kind']}/{o['metadata']['name']} names another namespace than the kustomization"
                )
                o["metadata"]["namespace"] = k["namespace"]
    for image in k.get("images", []):
        for o in objects:
            for c in _containers(o):
                if c["image"] == image["name"]:
                    c["image"] = f"{image['newName']}:{image['newTag']}"
    ids = [_identity(o) for o in objects]
    dupes = {i for i in ids if ids.count(i) > 1}
    assert not dupes, f"duplicate objects: {dupes}"
    return objects


def _merge(base: Any, patch: Any) -> Any:
    """Strategic merge as kustomize does it for a custom resource: maps key by key, a null
    deletes, anything else (lists included) replaces."""
    if not isinstance(base, dict) or not isinstance(patch, dict):
        return patch
    out = dict(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(base.get(key), value)
    return out


def _json_patch(doc: dict[str, Any], op: dict[str, Any]) -> None:
    """One RFC 6902 ``add`` or ``replace`` (all our overlays use)."""
    assert op["op"] in ("add", "replace"), f"unsupported JSON patch op {op['op']}"
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
    node: Any = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        assert op["op"] == "replace" and int(last) < len(node), op["path"]
        node[int(last)] = op["value"]
    else:
        assert op["op"] == "add" or last in node, f"replace of a missing {op['path']}"
        node[last] = op["value"]


def _containers(o: dict[str, Any]) -> list[dict[str, Any]]:
    """The containers of a pod template: a Job's, or a RayCluster's head and worker groups'."""
    spec = o.get("spec", {})
    if o.get("kind") == "RayCluster":
        groups = [spec["headGroupSpec"], *spec.get("workerGroupSpecs", [])]
        return [c for g in groups for c in g["template"]["spec"]["containers"]]
    node = spec.get("template", {}).get("spec", {})
    return node.get("containers", [])


def test_kustomization_lists_every_manifest_and_nothing_else():
    k = one(KUBERAY / "kustomization.yaml")
    listed = set(k["resources"])
    on_disk = {
        p.name for p in KUBERAY.glob("*.yaml") if p.name not in ("kustomization.yaml", "secret.example.yaml")
    }
    assert listed == on_disk
    assert "secret.example.yaml" not in listed


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda p: rel(p))
def test_kustomizations_resolve(directory: Path):
    objects = resolve_kustomization(directory)
    assert objects
    for o in objects:
        if o["kind"] not in CLUSTER_SCOPED:
            assert o["metadata"]["namespace"] == "falcon"
        for c in _containers(o):
            assert c["image"].endswith("/falcon-ray:" + c["image"].rsplit(":", 1)[1]), c["image"]
    if directory == KUBERAY_GSA:
        sa = next(o for o in objects if o["kind"] == "ServiceAccount")
        assert "iam.gke.io/gcp-service-account" in sa["metadata"]["annotations"]
    images = {rel(d): one(d / "kustomization.yaml")["images"] for d in (KUBERAY, KUBERAY_WORKERS, DB_UPGRADE)}
    assert len({json.dumps(v, sort_keys=True) for v in images.values()}) == 1, (
        f"image settings differ: {images}"
    )


def _kubectl_with_modern_kustomize() -> str | None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return None
    try:
        out = subprocess.run(
            [kubectl, "version", "--client"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"Kustomize Version: v(\d+)", out)
    return kubectl if m and int(m.group(1)) >= 4 else None


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda p: rel(p))
def test_kubectl_kustomize_builds_the_same_objects(directory: Path):
    kubectl = _kubectl_with_modern_kustomize()
    if kubectl is None:
        pytest.skip(
            "no kubectl with kustomize >= v4 on PATH; test_kustomizations_resolve covers the structure"
        )
    out = subprocess.run(
        [kubectl, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    built = [d for d in yaml.safe_load_all(out.stdout) if d]
    ours = resolve_kustomization(directory)
    assert sorted(map(_identity, built)) == sorted(map(_identity, ours))
    by_id = {_identity(o): o for o in ours}
    for o in built:
        want = by_id[_identity(o)]
        assert [c["image"] for c in _containers(o)] == [c["image"] for c in _containers(want)]
        assert o["metadata"].get("annotations", {}) == want["metadata"].get("annotations", {})
        # the patches merge as kustomize merges them: what the other tests read is what applies
        for key in ("spec", "data"):
            assert o.get(key) == want.get(key), f"{rel(directory)}: {o['kind']}/{o['metadata']['name']} {key} differs"


# --- the worker-group overlay (deploy/kuberay-workers) -------------------------------------------


def workers_build() -> dict[tuple[str, str], dict[str, Any]]:
    """The overlay resolved, by (kind, name)."""
    return {(o["kind"], o["metadata"]["name"]): o for o in resolve_kustomization(KUBERAY_WORKERS)}


def ray_resources_param(value: str) -> dict[str, float]:
    """KubeRay's ``rayStartParams.resources``: a JSON object, quoted for the shell with
    its inner quotes escaped (``'"{\\"Custom1\\": 1}"'`` in YAML)."""
    assert value.startswith('"') and value.endswith('"'), f"resources must be shell-quoted: {value!r}"
    return json.loads(value[1:-1].replace('\\"', '"'))


def secret_refs(c: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (e["name"], e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
        for e in c.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }


def test_workers_overlay_lists_every_file_of_its_directory():
    k = one(KUBERAY_WORKERS / "kustomization.yaml")
    used = {r for r in k["resources"] if not r.startswith("..")} | {p["path"] for p in k["patches"] if "path" in p}
    on_disk = {p.name for p in KUBERAY_WORKERS.glob("*.yaml") if p.name != "kustomization.yaml"}
    assert used == on_disk
    assert "../kuberay" in k["resources"], "the overlay builds on the base"


def test_workers_overlay_adds_one_worker_group_with_the_heads_identity_token_and_image():
    built = workers_build()
    rc = built[("RayCluster", "falcon")]
    head = rc["spec"]["headGroupSpec"]
    (group,) = rc["spec"]["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] >= 1
    params = group["rayStartParams"]
    assert all(isinstance(v, str) for v in params.values()), "rayStartParams values must be strings"
    assert params["num-cpus"] == "0", "the actors reserve no CPU; nothing else belongs there"
    pod = group["template"]["spec"]
    head_pod = head["template"]["spec"]
    # Workload Identity: the same Kubernetes service account as the head, so the same principal
    assert pod["serviceAccountName"] == head_pod["serviceAccountName"] == CONTROLLER
    sa = built[("ServiceAccount", CONTROLLER)]
    assert sa["metadata"]["namespace"] == rc["metadata"]["namespace"] == "falcon"
    assert pod["securityContext"] == head_pod["securityContext"]
    worker = pod["containers"][0]  # KubeRay's Ray container
    head_ray = head_pod["containers"][0]
    assert head_ray["name"] == RAY_CONTAINER
    assert worker["image"] == head_ray["image"], "one image for every Ray node"
    # the Secrets: exactly what the head's Ray container takes: the Ray token in the
    # environment, the database URL as the file the actors are given (file:/etc/falcon-db/url)
    assert secret_refs(worker) == secret_refs(head_ray) == {("RAY_AUTH_TOKEN", "falcon-ray-auth", "auth_token")}
    assert db_secret_mount(worker, pod) == db_secret_mount(head_ray, head_pod) == DB_MOUNT
    assert env_of(worker)["RAY_AUTH_MODE"]["value"] == "token"
    assert worker["securityContext"] == head_ray["securityContext"]
    res = worker["resources"]
    assert res["requests"]["memory"] == res["limits"]["memory"], "request = limit: not the first evicted"
    # /tmp/ray and /dev/shm as on the head; the shm volume holds the object store
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in worker["volumeMounts"]}
    assert mounts == {"ray-tmp": "/tmp/ray", "dshm": "/dev/shm", "falcon-db": DB_MOUNT}
    assert vols["dshm"]["emptyDir"]["medium"] == "Memory"
    shm = int(vols["dshm"]["emptyDir"]["sizeLimit"].removesuffix("Mi")) * 2**20
    assert int(params["object-store-memory"]) <= shm
    # a valid pod
    kubernetes_validate.validate(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w", "namespace": "falcon", **group["template"]["metadata"]}, "spec": pod},
        K8S_VERSION,
        strict=True,
    )


def test_workers_overlay_config_sets_actor_resource_to_what_only_the_workers_advertise(tmp_path):
    from actors import names, remote

    built = workers_build()
    rc = built[("RayCluster", "falcon")]
    (group,) = rc["spec"]["workerGroupSpecs"]
    advertised = ray_resources_param(group["rayStartParams"]["resources"])
    path = tmp_path / "config.yaml"
    path.write_text(built[("ConfigMap", "falcon-config")]["data"]["config.yaml"])
    settings = load_settings(path)
    assert settings.actor_resource == "falcon_worker"
    assert set(advertised) == {settings.actor_resource}
    assert "resources" not in rc["spec"]["headGroupSpec"]["rayStartParams"], "the head must not attract the actors"
    # the base's settings and no other change: the copy of config.yaml does not drift
    base = tmp_path / "base.yaml"
    base.write_text(one(KUBERAY / "configmap.yaml")["data"]["config.yaml"])
    assert settings == load_settings(base).model_copy(update={"actor_resource": "falcon_worker"})
    assert Settings().actor_resource == "", "default: no custom resource, actors anywhere"
    # what the actors then ask for: 0.001 each, so one worker's 1000 never runs out
    for opts in (
        remote._worker_options(names.cluster_name("edge-a"), settings, remote.CLUSTER_CONCURRENCY),
        remote._worker_options(names.queue_name("edge-a", "2x2"), settings, remote.QUEUE_CONCURRENCY),
    ):
        assert opts["resources"] == {"falcon_worker": remote.ACTOR_RESOURCE_AMOUNT} and opts["num_cpus"] == 0
        assert advertised["falcon_worker"] / remote.ACTOR_RESOURCE_AMOUNT >= 100_000
    assert "resources" not in remote._worker_options("queue/a/2x2", Settings(), 1)


def test_workers_overlay_opens_the_ray_pods_to_each_other_and_scrapes_the_workers():
    built = workers_build()
    rc = built[("RayCluster", "falcon")]
    (group,) = rc["spec"]["workerGroupSpecs"]
    worker = group["template"]["spec"]["containers"][0]
    internal = built[("NetworkPolicy", "falcon-ray-internal")]["spec"]
    selector = {"ray.io/cluster": rc["metadata"]["name"]}
    assert internal["podSelector"]["matchLabels"] == selector
    assert internal["ingress"] == [{"from": [{"podSelector": {"matchLabels": selector}}]}], "every port, Ray pods only"
    assert built[("NetworkPolicy", "falcon-ray-head")] == one(KUBERAY / "networkpolicy.yaml"), "the base policy stays"
    pm = built[("PodMonitor", "falcon-ray-workers")]["spec"]
    assert pm["selector"]["matchLabels"] == {**selector, "ray.io/node-type": "worker"}
    (ep,) = pm["podMetricsEndpoints"]
    assert named_port(worker, ep["port"]) == int(group["rayStartParams"]["metrics-export-port"])


def test_workers_overlay_shrinks_the_head_to_ray_the_poller_and_the_object_store():
    rc = workers_build()[("RayCluster", "falcon")]
    head_ray = rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head_ray["name"] == RAY_CONTAINER
    res = head_ray["resources"]
    assert res["requests"]["memory"] == res["limits"]["memory"] == "2Gi"
    # the rest of the head is the base's
    base_head = head_spec()
    assert rc["spec"]["headGroupSpec"]["rayStartParams"] == base_head["rayStartParams"]
    assert [c["name"] for c in rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"]] == [RAY_CONTAINER, CONTROLLER]


# --- IAM -------------------------------------------------------------------------------------------

# Client method -> IAM permission. A method missing here fails the test: map it, then
# add the permission to deploy/iam/falcon-controller-role.yaml.
GKE_PERMISSIONS = {
    "get_cluster": "container.clusters.get",
    "create_node_pool": "container.nodePools.create",
    "delete_node_pool": "container.nodePools.delete",
    "get_node_pool": "container.nodePools.get",
    "list_node_pools": "container.nodePools.list",
    "get_operation": "container.operations.get",
}
COMPUTE_PERMISSIONS = {"get": "compute.reservations.get"}  # ReservationsClient
POLICY_PERMISSIONS = {"get": "compute.resourcePolicies.get"}  # ResourcePoliciesClient
K8S_VERBS = {
    "create": "create",
    "read": "get",
    "delete": "delete",
    "list": "list",
    "patch": "update",
    "replace": "update",
}
CLIENT_ATTRS = {"client", "batch", "core"}
NOT_CALLS = {"transport"}  # attributes of the clients that are not API methods


def _client_attribute(node: ast.AST) -> str | None:
    """``self.client.X`` / ``self.batch.X`` / ``self.kube.core.X`` -> ``X``."""
    if not isinstance(node, ast.Attribute):
        return None
    owner = node.value
    if isinstance(owner, ast.Attribute) and owner.attr in CLIENT_ATTRS:
        base = owner.value
        if isinstance(base, ast.Name) and base.id == "self":
            return node.attr
        if isinstance(base, ast.Attribute) and base.attr == "kube":
            return node.attr
    return None


def _k8s_permission(method: str, watch: bool = False) -> str:
    m = re.fullmatch(r"(create|read|delete|list|patch|replace)_(namespaced_)?([a-z_]+)", method)
    assert m, f"unmapped Kubernetes client method {method}"
    resource = m.group(3)
    plural = resource if resource.endswith("s") else resource + "s"
    verb = "watch" if watch else K8S_VERBS[m.group(1)]
    return f"container.{plural}.{verb}"


def permissions_the_code_needs() -> dict[str, set[str]]:
    """Permission -> where it is needed, from the ASTs of the two API adapters."""
    needed: dict[str, set[str]] = {}

    def need(perm: str, where: str) -> None:
        needed.setdefault(perm, set()).add(where)

    gcp = ast.parse((REPO / "falcon_ray" / "gcp.py").read_text())
    classes = {n.name: n for n in gcp.body if isinstance(n, ast.ClassDef)}
    for cls, table, client in (
        ("GkeApi", GKE_PERMISSIONS, "container_v1.ClusterManagerClient"),
        ("ComputeApi", COMPUTE_PERMISSIONS, "compute_v1.ReservationsClient"),
        ("ResourcePolicyApi", POLICY_PERMISSIONS, "ResourcePoliciesClient"),
    ):
        assert cls in classes, f"falcon_ray/gcp.py has no class {cls}"
        assert client in ast.unparse(classes[cls]), f"{cls} no longer builds a {client}"
        for node in ast.walk(classes[cls]):
            method = _client_attribute(node)
            if method is None or method in NOT_CALLS:
                continue
            assert method in table, f"gcp.{cls} calls {method}: map it to an IAM permission"
            need(table[method], f"gcp.{cls}.{method}")

    kube_src = (REPO / "falcon_ray" / "kube.py").read_text()
    assert (
        "self.batch = client.BatchV1Api(api)" in kube_src and "self.core = client.CoreV1Api(api)" in kube_src
    )
    kube = ast.parse(kube_src)
    watched: set[str] = set()
    for node in ast.walk(kube):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "stream":
            assert node.args, "watch.stream without the list function"
            method = _client_attribute(node.args[0])
            assert method, f"watch of something other than a client method: {ast.unparse(node.args[0])}"
            watched.add(method)
    for node in ast.walk(kube):
        method = _client_attribute(node)
        if method is None or method in NOT_CALLS:
            continue
        need(_k8s_permission(method), f"kube.{method}")
    for method in watched:
        need(_k8s_permission(method, watch=True), f"kube watch of {method}")
    return needed


def test_only_the_two_adapters_talk_to_google_and_kubernetes_apis():
    """So that scanning gcp.py and kube.py finds every call the controller makes."""
    allowed = {
        "falcon_ray/gcp.py",
        "falcon_ray/kube.py",
        "falcon_ray/errors.py",
    }  # errors: exception types only
    for path in [*(REPO / "falcon_ray").rglob("*.py"), *(REPO / "actors").rglob("*.py")]:
        name = rel(path)
        if name.startswith(("falcon_ray/sim/", "falcon_ray/devtools/")):
            continue  # the simulated fleet serves these APIs; the tools never run in production
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            mods: list[str] = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                mods = [node.module]
            for mod in mods:
                if mod.split(".")[0] == "kubernetes" or mod.startswith("google.cloud"):
                    assert name in allowed, f"{name} imports {mod}; only gcp.py and kube.py may call the APIs"


def test_iam_role_grants_exactly_what_the_code_calls():
    role = one(ROLE_FILE)
    assert set(role) >= {"title", "description", "stage", "includedPermissions"}
    assert role["stage"] == "GA"
    granted = role["includedPermissions"]
    assert len(granted) == len(set(granted)), "duplicate permissions"
    needed = permissions_the_code_needs()
    missing = set(needed) - set(granted)
    extra = set(granted) - set(needed)
    assert not missing, f"the role lacks {sorted(missing)} ({ {p: sorted(needed[p]) for p in missing} })"
    assert not extra, f"the role grants {sorted(extra)}, which no code calls"
    # The families the controller cannot work without.
    assert {"container.nodePools.create", "container.jobs.watch", "compute.reservations.get"} <= set(granted)


def _run_print_gcloud(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(exist_ok=True)
    marker = tmp_path / "gcloud-was-run"
    for tool in ("gcloud", "kubectl"):
        fake = fake_bin / tool
        fake.write_text(f"#!/bin/sh\necho {tool} >> '{marker}'\nexit 1\n")
        fake.chmod(0o755)
    full_env = {"PATH": f"{fake_bin}{os.pathsep}{os.environ.get('PATH', '')}", "HOME": str(tmp_path), **env}
    result = subprocess.run(
        ["bash", str(PRINT_GCLOUD.relative_to(REPO)), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=full_env,
        timeout=30,
        check=False,
    )
    assert not marker.exists(), "print-gcloud.sh must only print, never run gcloud or kubectl"
    return result


def test_print_gcloud_is_valid_bash():
    subprocess.run(["bash", "-n", str(PRINT_GCLOUD)], check=True, timeout=30)
    assert os.access(PRINT_GCLOUD, os.X_OK)


def test_print_gcloud_prints_role_and_bindings_for_every_edge_project(tmp_path):
    env = {
        "CENTRAL_PROJECT": "tpu-service-473302",
        "CENTRAL_PROJECT_NUMBER": "123456789012",
        "EDGE_PROJECTS": "poc-tpu-partner edge-two-1",
        "LOG_BUCKETS": "poc-tpu-partner=gs://falcon-logs",
    }
    result = _run_print_gcloud(tmp_path, env)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    principal = (
        "principal://iam.googleapis.com/projects/123456789012/locations/global/workloadIdentityPools/"
        "tpu-service-473302.svc.id.goog/subject/ns/falcon/sa/falcon-controller"
    )
    commands = [
        line for line in out.replace("\\\n", " ").splitlines() if line.strip() and not line.startswith("#")
    ]
    for edge in ("poc-tpu-partner", "edge-two-1"):
        create = [
            c for c in commands if c.startswith(f"gcloud iam roles create falconController --project={edge} ")
        ]
        assert len(create) == 1
        file_arg = re.search(r"--file=(\S+)", create[0]).group(1)
        assert (REPO / file_arg).resolve() == ROLE_FILE.resolve()
        binding = [c for c in commands if c.startswith(f"gcloud projects add-iam-policy-binding {edge} ")]
        assert len(binding) == 1
        assert f"--role=projects/{edge}/roles/falconController" in binding[0]
        assert f"--member='{principal}'" in binding[0]
        act_as = [c for c in commands if "roles/iam.serviceAccountUser" in c and f"--project={edge}" in c]
        assert len(act_as) == 1 and principal in act_as[0]
    bucket = [
        c for c in commands if c.startswith("gcloud storage buckets add-iam-policy-binding gs://falcon-logs ")
    ]
    assert len(bucket) == 1
    assert "--role=roles/storage.objectUser" in bucket[0]
    assert (
        "workloadIdentityPools/poc-tpu-partner.svc.id.goog/subject/ns/falcon-jobs/sa/falcon-job" in bucket[0]
    )
    # Without a bucket for edge-two-1 the binding is printed as a comment to fill in.
    assert "workloadIdentityPools/edge-two-1.svc.id.goog/subject/ns/falcon-jobs/sa/falcon-job" in out
    assert "--workload-pool=" in out and "GcsFuseCsiDriver=ENABLED" in out and "GKE_METADATA" in out
    # The printed `clusters add` uses only real options.
    add = re.search(r"#\s+(falcon-ray clusters add .*?)(?:\n(?!#\s{5,})|\Z)", out, re.S).group(1)
    argv = [
        t for t in shlex.split(add.replace("\\\n#", " ").replace("[", " ").replace("]", " ")) if t != "\\"
    ]
    cmd, path, rest = resolve_cli(argv)
    assert path == ["falcon-ray", "clusters", "add"]
    check_options(cmd, path, rest)


def test_print_gcloud_gsa_variant_binds_the_google_service_account(tmp_path):
    gsa = "falcon-controller@tpu-service-473302.iam.gserviceaccount.com"
    env = {"CENTRAL_PROJECT": "tpu-service-473302", "CENTRAL_PROJECT_NUMBER": "123456789012", "GSA": gsa}
    result = _run_print_gcloud(tmp_path, env, "poc-tpu-partner")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "--role=roles/iam.workloadIdentityUser" in out
    assert "serviceAccount:tpu-service-473302.svc.id.goog[falcon/falcon-controller]" in out
    assert f"--member='serviceAccount:{gsa}'" in out
    assert "principal://" not in out.split("# ---- edge project")[1].split("GCS FUSE")[0]


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"CENTRAL_PROJECT": "tpu-service-473302", "EDGE_PROJECTS": "poc-tpu-partner"},
        {"CENTRAL_PROJECT": "tpu-service-473302", "CENTRAL_PROJECT_NUMBER": "123456789012"},
        {"CENTRAL_PROJECT": "Bad_Project", "CENTRAL_PROJECT_NUMBER": "1", "EDGE_PROJECTS": "poc-tpu-partner"},
    ],
    ids=["nothing", "no-number", "no-edges", "bad-id"],
)
def test_print_gcloud_refuses_incomplete_input(tmp_path, env):
    result = _run_print_gcloud(tmp_path, env)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "print-gcloud.sh:" in result.stderr


# --- Grafana ---------------------------------------------------------------------------------------

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
METRIC_RE = re.compile(r"\bray_[A-Za-z0-9_]+")


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_panels() -> list[dict[str, Any]]:
    out = []
    for p in dashboard()["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def resolve_metric(exported: str) -> tuple[str, str]:
    """``ray_falcon_x_bucket`` -> (``falcon_x``, ``_bucket``), checked against DEFINITIONS."""
    name = exported.removeprefix("ray_")
    if name in metrics.DEFINITIONS:
        kind = metrics.DEFINITIONS[name][0]
        assert kind != "histogram", f"{exported}: a histogram is queried through _bucket, _sum or _count"
        return name, ""
    for suffix in HISTOGRAM_SUFFIXES:
        base = name.removesuffix(suffix)
        if name.endswith(suffix) and base in metrics.DEFINITIONS:
            assert metrics.DEFINITIONS[base][0] == "histogram", f"{exported}: {base} is not a histogram"
            return base, suffix
    raise AssertionError(f"{exported} is not in falcon_ray/metrics.py DEFINITIONS")


def dashboard_exprs() -> list[tuple[str, str]]:
    exprs = []
    for p in dashboard_panels():
        for t in p.get("targets", []):
            exprs.append((p["title"], t["expr"]))
    return exprs


def test_dashboard_uses_a_prometheus_datasource_variable():
    d = dashboard()
    variables = {v["name"]: v for v in d["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    ids = [p["id"] for p in dashboard_panels()]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in dashboard_panels():
        assert 0 <= p["gridPos"]["x"] and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], f"panel {p['title']!r} has no query"
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"
    cluster = variables["cluster"]
    (metric,) = METRIC_RE.findall(cluster["definition"])
    name, _ = resolve_metric(metric)
    assert "cluster" in metrics.DEFINITIONS[name][2]


def test_every_metric_and_label_on_the_dashboard_exists_in_metrics_definitions():
    for title, expr in dashboard_exprs():
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), (
            f"{title}: unbalanced {expr}"
        )
        found = METRIC_RE.findall(expr)
        assert found, f"{title}: no ray_falcon_ metric in {expr}"
        allowed: set[str] = set()
        for exported in found:
            name, suffix = resolve_metric(exported)
            allowed.update(metrics.DEFINITIONS[name][2])
            if suffix == "_bucket":
                allowed.add("le")
        for selector in re.findall(r"\{([^}]*)\}", expr):
            for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"", selector):
                assert label in allowed, f"{title}: label {label!r} is not a label of {found}"
        for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
            for label in filter(None, (x.strip() for x in group.split(","))):
                assert label in allowed, f"{title}: grouping by {label!r}, not a label of {found}"


def test_dashboard_charts_what_operators_asked_for():
    used = {
        resolve_metric(m)[0] + resolve_metric(m)[1]
        for _t, e in dashboard_exprs()
        for m in METRIC_RE.findall(e)
    }
    required = {
        "falcon_queue_tasks",
        "falcon_time_to_running_seconds_bucket",
        "falcon_pending_reason_seconds_bucket",
        "falcon_task_outcomes_total",
        "falcon_node_pools_alive",
        "falcon_node_pools_idle",
        "falcon_reservation_headroom_hosts",
        "falcon_gke_operations_total",
        "falcon_watch_relists_total",
        "falcon_watch_reconnects_total",
        "falcon_poll_duration_seconds_bucket",
        "falcon_orphan_pools_deleted_total",
        "falcon_idle_tpu_chip_seconds_total",
        "falcon_disruptions_total",
        "falcon_recoveries_total",
    }
    assert required <= used, f"not charted: {sorted(required - used)}"
    exprs = [e for _t, e in dashboard_exprs()]
    assert any(
        'status="Failed"' in e and "by (reason)" in e and "ray_falcon_task_outcomes_total" in e for e in exprs
    )
    assert any("histogram_quantile" in e and "ray_falcon_time_to_running_seconds_bucket" in e for e in exprs)
    assert any("ray_falcon_gke_operations_total" in e and "result" in e and "error_kind" in e for e in exprs)
    assert any("ray_falcon_queue_tasks" in e and "state" in e for e in exprs)
