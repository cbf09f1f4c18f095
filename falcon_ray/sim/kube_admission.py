"""What the simulated apiserver does to a body before storing it: decode checks, validation, defaulting, admission.

Contract
--------
Every function raises :class:`~falcon_ray.sim.errors.KubeError` with the code the
real apiserver uses, so no malformed object ever reaches the store or the
in-cluster controllers:

* ``decode_error`` - 400: a field has the wrong JSON type (the apiserver's decoder
  refuses the body before validation).
* ``invalid`` - 422 ``Invalid`` with ``details.causes``: a required field is
  missing or a value is not allowed.
* ``validate_metadata``, ``validate_pod_spec``, ``validate_job_spec``,
  ``validate_node``, ``validate_status`` check the fields the simulator reads.
* ``normalize_quantities`` accepts a resource map's quantities as JSON strings
  or numbers and stores them in the apiserver's canonical string form
  (``google.com/tpu: 4`` -> ``"4"``, ``cpu: 0.5`` -> ``"500m"``); a value that is
  no quantity is refused 400 as the decoder does. Pod specs (containers and
  init containers) and Node ``status.capacity`` / ``allocatable`` go through it.
* ``default_job`` / ``default_pod`` / ``default_service`` fill what the apiserver
  fills (Job selector on its uid, parallelism, completions, backoffLimit...).
* ``deny_images`` is the policy webhook driven by the ``deny_images`` fault (403);
  ``webhook_unreachable`` is the same webhook with its endpoints gone (the
  ``webhook_unavailable`` fault): with ``failurePolicy: Fail`` the apiserver answers
  500 ``InternalError`` "failed calling webhook", a refusal for now.
* ``not_found``, ``conflict``, ``qualified`` and ``group`` build the usual messages.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .errors import KubeError
from .kube_store import RESOURCES, ResourceKind
from .quantities import canonical
from .workloads import CONTROLLER_UID_LABEL, JOB_NAME_LABEL

WEBHOOK = "policy.example.com"
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

# JSON types by the Go type names the apiserver's decoder reports
_IS: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "[]object": lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
    "[]string": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "[]integer": lambda v: (
        isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
    ),
    "map[string]string": lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
}
POD_SPEC_FIELDS = {
    "containers": "[]object",
    "initContainers": "[]object",
    "nodeSelector": "map[string]string",
    "tolerations": "[]object",
    "affinity": "object",
    "restartPolicy": "string",
    "hostname": "string",
    "subdomain": "string",
    "nodeName": "string",
    "serviceAccountName": "string",
    "volumes": "[]object",
}
CONTAINER_FIELDS = {
    "name": "string",
    "image": "string",
    "command": "[]string",
    "args": "[]string",
    "env": "[]object",
    "resources": "object",
    "volumeMounts": "[]object",
    "ports": "[]object",
}


def group(rk: ResourceKind) -> str:
    return rk.api_version.split("/")[0] if "/" in rk.api_version else ""


def qualified(rk: ResourceKind) -> str:
    """``jobs.batch`` / ``pods``: how the apiserver names a resource in messages."""
    return f"{rk.plural}.{group(rk)}" if group(rk) else rk.plural


def decode_error(rk: ResourceKind, field: str, go_type: str) -> KubeError:
    version = rk.api_version.split("/")[-1]
    return KubeError(
        400,
        f'{rk.kind} in version "{version}" cannot be handled as a {rk.kind}: '
        f"json: cannot unmarshal into Go struct field {field} of type {go_type}",
        "BadRequest",
    )


def normalize_quantities(rk: ResourceKind, resources: Any, where: str) -> None:
    """Canonicalize, in place, a ``{name: quantity}`` map (400 for a value that is not a quantity)."""
    if resources is None:
        return
    if not isinstance(resources, dict):
        raise decode_error(rk, where, "v1.ResourceList")
    for name, qty in resources.items():
        try:
            resources[name] = canonical(qty)
        except ValueError as e:
            version = rk.api_version.split("/")[-1]
            if isinstance(qty, (str, int, float)) and not isinstance(qty, bool):
                raise KubeError(
                    400,
                    f'{rk.kind} in version "{version}" cannot be handled as a {rk.kind}: {e}',
                    "BadRequest",
                ) from None
            raise decode_error(rk, f"{where}[{name}]", "Quantity") from None


def invalid(rk: ResourceKind, name: str, field: str, reason: str, detail: str) -> KubeError:
    kind_ref = f"{rk.kind}.{group(rk)}" if group(rk) else rk.kind
    return KubeError(
        422,
        f'{kind_ref} "{name}" is invalid: {field}: {detail}',
        "Invalid",
        {
            "name": name,
            "group": group(rk),
            "kind": rk.kind,
            "causes": [{"reason": reason, "message": detail, "field": field}],
        },
    )


def not_found(rk: ResourceKind, name: str) -> KubeError:
    details = {"name": name, "group": group(rk), "kind": rk.plural}
    return KubeError(404, f'{qualified(rk)} "{name}" not found', "NotFound", details)


def conflict(rk: ResourceKind, name: str, why: str) -> KubeError:
    details = {"name": name, "group": group(rk), "kind": rk.plural}
    return KubeError(
        409, f'Operation cannot be fulfilled on {qualified(rk)} "{name}": {why}', "Conflict", details
    )


def check_fields(rk: ResourceKind, obj: Any, where: str, fields: dict[str, str]) -> None:
    """400 unless ``obj`` is an object whose listed fields (when present) have their JSON types."""
    if not isinstance(obj, dict):
        raise decode_error(rk, where, "object")
    for key, go_type in fields.items():
        value = obj.get(key)
        if value is not None and not _IS[go_type](value):
            raise decode_error(rk, f"{where}.{key}", go_type)


def validate_metadata(rk: ResourceKind, md: Any) -> None:
    check_fields(
        rk,
        md,
        "metadata",
        {
            "name": "string",
            "generateName": "string",
            "namespace": "string",
            "labels": "map[string]string",
            "annotations": "map[string]string",
            "ownerReferences": "[]object",
        },
    )


def validate_pod_spec(rk: ResourceKind, name: str, spec: Any, where: str) -> dict[str, Any]:
    if not isinstance(spec, dict):
        raise invalid(rk, name, where, "FieldValueRequired", "Required value")
    check_fields(rk, spec, where, POD_SPEC_FIELDS)
    containers = spec.get("containers") or []
    if not containers:
        raise invalid(rk, name, f"{where}.containers", "FieldValueRequired", "Required value")
    for key in ("containers", "initContainers"):
        for i, c in enumerate(spec.get(key) or []):
            _validate_container(rk, name, c, f"{where}.{key}[{i}]")
    for i, tol in enumerate(spec.get("tolerations") or []):
        check_fields(
            rk,
            tol,
            f"{where}.tolerations[{i}]",
            {"key": "string", "operator": "string", "value": "string", "effect": "string"},
        )
    affinity = spec.get("affinity") or {}
    check_fields(rk, affinity, f"{where}.affinity", {"nodeAffinity": "object"})
    node_affinity = affinity.get("nodeAffinity") or {}
    required_key = "requiredDuringSchedulingIgnoredDuringExecution"
    check_fields(rk, node_affinity, f"{where}.affinity.nodeAffinity", {required_key: "object"})
    required = node_affinity.get(required_key) or {}
    at = f"{where}.affinity.nodeAffinity.{required_key}"
    check_fields(rk, required, at, {"nodeSelectorTerms": "[]object"})
    for i, term in enumerate(required.get("nodeSelectorTerms") or []):
        check_fields(rk, term, f"{at}.nodeSelectorTerms[{i}]", {"matchExpressions": "[]object"})
        for j, expr in enumerate(term.get("matchExpressions") or []):
            check_fields(
                rk,
                expr,
                f"{at}.nodeSelectorTerms[{i}].matchExpressions[{j}]",
                {"key": "string", "operator": "string", "values": "[]string"},
            )
    return spec


def _validate_container(rk: ResourceKind, name: str, c: Any, at: str) -> None:
    check_fields(rk, c, at, CONTAINER_FIELDS)
    for j, env in enumerate(c.get("env") or []):
        check_fields(rk, env, f"{at}.env[{j}]", {"name": "string", "value": "string", "valueFrom": "object"})
    resources = c.get("resources") or {}
    check_fields(rk, resources, f"{at}.resources", {"limits": "object", "requests": "object"})
    for key in ("limits", "requests"):
        normalize_quantities(rk, resources.get(key), f"{at}.resources.{key}")
    for key in ("name", "image"):
        if not c.get(key):
            raise invalid(rk, name, f"{at}.{key}", "FieldValueRequired", "Required value")


def validate_job_spec(name: str, spec: Any) -> dict[str, Any]:
    rk = RESOURCES["jobs"]
    if not isinstance(spec, dict):
        raise invalid(rk, name, "spec", "FieldValueRequired", "Required value")
    check_fields(
        rk, spec, "spec", {"suspend": "boolean", "manualSelector": "boolean", "completionMode": "string"}
    )
    template = spec.get("template")
    if not isinstance(template, dict):
        raise invalid(rk, name, "spec.template", "FieldValueRequired", "Required value")
    check_fields(rk, template, "spec.template", {"metadata": "object", "spec": "object"})
    check_fields(
        rk,
        template.get("metadata") or {},
        "spec.template.metadata",
        {"labels": "map[string]string", "annotations": "map[string]string"},
    )
    pod_spec = validate_pod_spec(rk, name, template.get("spec"), "spec.template.spec")
    restart = pod_spec.get("restartPolicy")
    if restart not in ("Never", "OnFailure"):
        detail = (
            'Required value: valid values: "OnFailure", "Never"'
            if restart is None
            else f'Unsupported value: "{restart}": supported values: "OnFailure", "Never"'
        )
        raise invalid(rk, name, "spec.template.spec.restartPolicy", "FieldValueNotSupported", detail)
    if spec.get("podFailurePolicy") is not None:
        validate_pod_failure_policy(name, spec, pod_spec)
    for key in ("parallelism", "completions", "backoffLimit", "activeDeadlineSeconds"):
        value = spec.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise invalid(rk, name, f"spec.{key}", "FieldValueInvalid", "must be greater than or equal to 0")
    mode = spec.get("completionMode", "NonIndexed")
    if mode not in ("NonIndexed", "Indexed"):
        raise invalid(
            rk, name, "spec.completionMode", "FieldValueNotSupported", f'Unsupported value: "{mode}"'
        )
    if mode == "Indexed" and spec.get("completions") is None:
        raise invalid(
            rk,
            name,
            "spec.completions",
            "FieldValueRequired",
            "Required value: when completion mode is Indexed",
        )
    return spec


POD_FAILURE_ACTIONS = ("Count", "FailIndex", "FailJob", "Ignore")
MAX_POD_FAILURE_RULES = 20


def validate_pod_failure_policy(name: str, spec: dict[str, Any], pod_spec: dict[str, Any]) -> None:
    """422 as the apiserver's ``validatePodFailurePolicy``: restartPolicy Never, well-formed rules.

    Wording from kubernetes ``pkg/apis/batch/validation/validation.go``; the first problem found is reported.
    """
    rk = RESOURCES["jobs"]
    policy = spec["podFailurePolicy"]
    check_fields(rk, policy, "spec.podFailurePolicy", {"rules": "[]object"})
    restart = pod_spec.get("restartPolicy")
    if restart != "Never":
        raise invalid(
            rk,
            name,
            "spec.template.spec.restartPolicy",
            "FieldValueInvalid",
            f'Invalid value: "{restart}": only "Never" is supported when podFailurePolicy is specified',
        )
    rules = policy.get("rules") or []
    if len(rules) > MAX_POD_FAILURE_RULES:
        raise invalid(
            rk,
            name,
            "spec.podFailurePolicy.rules",
            "FieldValueTooMany",
            f"Too many: {len(rules)}: must have at most {MAX_POD_FAILURE_RULES} items",
        )
    containers = {c.get("name") for key in ("containers", "initContainers") for c in pod_spec.get(key) or []}
    for i, rule in enumerate(rules):
        at = f"spec.podFailurePolicy.rules[{i}]"
        check_fields(
            rk, rule, at, {"action": "string", "onExitCodes": "object", "onPodConditions": "[]object"}
        )
        action = rule.get("action")
        if not action:
            detail = 'Required value: valid values: ["Count" "FailIndex" "FailJob" "Ignore"]'
            raise invalid(rk, name, f"{at}.action", "FieldValueRequired", detail)
        if action == "FailIndex" and spec.get("backoffLimitPerIndex") is None:
            detail = 'Invalid value: "FailIndex": requires the backoffLimitPerIndex to be set'
            raise invalid(rk, name, f"{at}.action", "FieldValueInvalid", detail)
        if action not in POD_FAILURE_ACTIONS:
            detail = (
                f'Unsupported value: "{action}": supported values: "Count", "FailIndex", "FailJob", "Ignore"'
            )
            raise invalid(rk, name, f"{at}.action", "FieldValueNotSupported", detail)
        on_codes, on_conditions = rule.get("onExitCodes"), rule.get("onPodConditions")
        if on_codes is not None and on_conditions:
            detail = "Invalid value: specifying both OnExitCodes and OnPodConditions is not supported"
            raise invalid(rk, name, at, "FieldValueInvalid", detail)
        if on_codes is None and not on_conditions:
            detail = "Invalid value: specifying one of OnExitCodes and OnPodConditions is required"
            raise invalid(rk, name, at, "FieldValueInvalid", detail)
        if on_codes is not None:
            _validate_on_exit_codes(rk, name, on_codes, f"{at}.onExitCodes", containers)
        for j, pattern in enumerate(on_conditions or []):
            check_fields(rk, pattern, f"{at}.onPodConditions[{j}]", {"type": "string", "status": "string"})
            if not pattern.get("type"):
                raise invalid(
                    rk, name, f"{at}.onPodConditions[{j}].type", "FieldValueRequired", "Required value"
                )
            status = pattern.get("status", "True")
            if status not in ("False", "True", "Unknown"):
                detail = f'Unsupported value: "{status}": supported values: "False", "True", "Unknown"'
                raise invalid(rk, name, f"{at}.onPodConditions[{j}].status", "FieldValueNotSupported", detail)


def _validate_on_exit_codes(
    rk: ResourceKind, name: str, req: dict[str, Any], at: str, containers: set[Any]
) -> None:
    check_fields(rk, req, at, {"containerName": "string", "operator": "string", "values": "[]integer"})
    operator = req.get("operator")
    if operator not in ("In", "NotIn"):
        detail = (
            'Required value: valid values: ["In" "NotIn"]'
            if not operator
            else f'Unsupported value: "{operator}": supported values: "In", "NotIn"'
        )
        raise invalid(rk, name, f"{at}.operator", "FieldValueNotSupported", detail)
    container = req.get("containerName")
    if container is not None and container not in containers:
        detail = f'Invalid value: "{container}": must be one of the container or initContainer names in the pod template'
        raise invalid(rk, name, f"{at}.containerName", "FieldValueInvalid", detail)
    values = req.get("values") or []
    if not values:
        raise invalid(
            rk, name, f"{at}.values", "FieldValueInvalid", "Invalid value: at least one value is required"
        )
    for j, value in enumerate(values):
        if operator == "In" and value == 0:
            detail = "Invalid value: 0: must not be 0 for the In operator"
            raise invalid(rk, name, f"{at}.values[{j}]", "FieldValueInvalid", detail)
        if value in values[:j]:
            raise invalid(rk, name, f"{at}.values[{j}]", "FieldValueDuplicate", f"Duplicate value: {value}")
    if values != sorted(values):
        raise invalid(
            rk, name, f"{at}.values", "FieldValueInvalid", f"Invalid value: {values}: must be ordered"
        )


def validate_node(node: dict[str, Any]) -> None:
    """The node fields the scheduler reads must have their API types."""
    rk = RESOURCES["nodes"]
    spec = node.get("spec") or {}
    check_fields(rk, spec, "spec", {"taints": "[]object", "unschedulable": "boolean"})
    for i, taint in enumerate(spec.get("taints") or []):
        check_fields(rk, taint, f"spec.taints[{i}]", {"key": "string", "value": "string", "effect": "string"})
    status = node.get("status") or {}
    check_fields(
        rk, status, "status", {"allocatable": "object", "conditions": "[]object", "addresses": "[]object"}
    )
    for key in ("conditions", "addresses"):
        for i, item in enumerate(status.get(key) or []):
            check_fields(
                rk, item, f"status.{key}[{i}]", {"type": "string", "status": "string", "address": "string"}
            )
    for key in ("capacity", "allocatable"):
        normalize_quantities(rk, status.get(key), f"status.{key}")


def validate_status(rk: ResourceKind, obj: dict[str, Any]) -> None:
    """The status fields the in-cluster controllers read (pods and Jobs)."""
    status = obj.get("status", {})
    if not isinstance(status, dict):
        raise decode_error(rk, "status", "object")
    if rk.plural == "nodes":
        validate_node(obj)
    elif rk.plural in ("pods", "jobs"):
        check_fields(
            rk,
            status,
            "status",
            {"phase": "string", "conditions": "[]object", "containerStatuses": "[]object"},
        )
        for key in ("conditions", "containerStatuses"):
            for i, item in enumerate(status.get(key) or []):
                check_fields(
                    rk, item, f"status.{key}[{i}]", {"type": "string", "status": "string", "name": "string"}
                )


def validate_name(rk: ResourceKind, name: Any) -> str:
    if rk.plural == "jobs":  # the name becomes a label value: a DNS label, at most 63
        if not isinstance(name, str) or len(name) > 63 or not DNS_LABEL.match(name):
            raise invalid(
                rk,
                str(name),
                "metadata.name",
                "FieldValueInvalid",
                f'Invalid value: "{name}": a lowercase RFC 1123 label must consist of lower case alphanumeric '
                "characters or '-', and must start and end with an alphanumeric character (at most 63 characters)",
            )
    elif not isinstance(name, str) or len(name) > 253 or not DNS_SUBDOMAIN.match(name):
        raise invalid(
            rk,
            str(name),
            "metadata.name",
            "FieldValueInvalid",
            f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric '
            "characters, '-' or '.', and must start and end with an alphanumeric character",
        )
    return name


def default_job(body: dict[str, Any], name: str, uid: str) -> None:
    spec = validate_job_spec(name, body.get("spec"))
    spec.setdefault("completionMode", "NonIndexed")
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
    spec.setdefault("parallelism", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("suspend", False)
    spec.setdefault("manualSelector", False)
    policy = spec.get("podFailurePolicy")
    spec.setdefault("podReplacementPolicy", "Failed" if policy is not None else "TerminatingOrFailed")
    for rule in (policy or {}).get("rules") or []:
        for pattern in rule.get("onPodConditions") or []:
            pattern.setdefault("status", "True")  # the apiserver's default
    template_labels = spec["template"].setdefault("metadata", {}).setdefault("labels", {})
    if not spec.get("manualSelector"):
        spec["selector"] = {"matchLabels": {CONTROLLER_UID_LABEL: uid}}
        template_labels.update(
            {CONTROLLER_UID_LABEL: uid, JOB_NAME_LABEL: name, "controller-uid": uid, "job-name": name}
        )
    if not body["metadata"].get("labels"):
        body["metadata"]["labels"] = dict(template_labels)
    body["status"] = {}


def default_pod(body: dict[str, Any], name: str) -> None:
    spec = validate_pod_spec(RESOURCES["pods"], name, body.get("spec"), "spec")
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("schedulerName", "default-scheduler")
    body["status"] = {"phase": "Pending", "qosClass": "BestEffort"}


def default_service(body: dict[str, Any], next_ip: Callable[[], str]) -> None:
    spec = body.setdefault("spec", {})
    check_fields(
        RESOURCES["services"], spec, "spec", {"clusterIP": "string", "type": "string", "selector": "object"}
    )
    spec.setdefault("type", "ClusterIP")
    if not spec.get("clusterIP"):
        spec["clusterIP"] = next_ip()
    spec["clusterIPs"] = [spec["clusterIP"]]
    body["status"] = {"loadBalancer": {}}


def deny_images(rk: ResourceKind, name: str, pod_spec: dict[str, Any], prefixes: list[str]) -> None:
    """The policy webhook: 403 when a container image starts with a denied prefix."""
    for key in ("initContainers", "containers"):
        for c in pod_spec.get(key) or []:
            image = str(c.get("image", ""))
            for prefix in prefixes:
                if prefix and image.startswith(prefix):
                    raise KubeError(
                        403,
                        f'admission webhook "{WEBHOOK}" denied the request: image "{image}" is not allowed '
                        f'(images starting with "{prefix}" are denied in this cluster)',
                        "Forbidden",
                        {"name": name, "group": group(rk), "kind": rk.plural},
                    )


WEBHOOK_URL = "https://policy-webhook.policy.svc:443/validate?timeout=10s"
WEBHOOK_ADDRESS = "10.96.0.42:443"


def webhook_unreachable(rk: ResourceKind, name: str) -> None:
    """The policy webhook has no endpoint: the apiserver fails the create (failurePolicy Fail)
    with a 500 whose one cause is the call's error."""
    cause = (
        f'failed calling webhook "{WEBHOOK}": failed to call webhook: '
        f'Post "{WEBHOOK_URL}": dial tcp {WEBHOOK_ADDRESS}: connect: connection refused'
    )
    details = {"name": name, "group": group(rk), "kind": rk.plural, "causes": [{"message": cause}]}
    raise KubeError(500, f"Internal error occurred: {cause}", "InternalError", details)
