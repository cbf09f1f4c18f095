"""The task spec: the only user input Falcon turns into cloud and cluster objects.

Contract
--------
``parse_spec(raw)`` takes the ``jobs.spec`` column as stored (JSON text, bytes or an
already-decoded dict) and returns a frozen :class:`TaskSpec`, or raises
:class:`SpecError` -- and only ``SpecError`` -- whose message names the offending
field and, where there is a closed set, the allowed values. The controller turns a
``SpecError`` into ``Failed / InvalidSpec`` with that message; it never crashes on a
spec.

What is deliberately absent: privileged mode, host paths, host network, namespace,
service account, volumes, node selectors, tolerations. Unknown fields are refused, so
none of them can be smuggled in; the namespace and service account come from the
cluster registry, the node placement from the TPU catalogue.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from falcon_ray import tpu

# A run of up to 30 days (reservation and on-demand capacity); flex-start VMs live at most
# seven days, so a longer task is refused where flex-start is its only supply
# (scheduling.outlives_flex_start: NoCandidateCluster, naming the limit).
MAX_TIMEOUT_SECONDS = 30 * 24 * 3600
DEFAULT_TIMEOUT_SECONDS = 3600
MAX_ARGV_BYTES = 64 * 1024
MAX_ARGV_ITEMS = 1024
MAX_ENV_ITEMS = 256
MAX_ENV_BYTES = 64 * 1024
MAX_IMAGE_LEN = 512
MAX_RECOVERIES = 100
# The longest start deadline: a task that may wait longer than a month to start has none to give.
MAX_START_DEADLINE_SECONDS = 30 * 24 * 3600

# Docker reference grammar, simplified: [registry[:port]/]path[:tag][@digest]
_IMAGE_RE = re.compile(
    r"^(?:[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?/)?"  # registry host (optional)
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"  # first path component
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"  # more path components
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"  # tag
    r"(?:@sha256:[a-f0-9]{64})?$"  # digest
)
# Kubernetes' rule for container env names (validation.IsEnvVarName).
_ENV_NAME_RE = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
# Kubernetes resource quantity, e.g. 4, 500m, 16Gi, 1.5.
_QUANTITY_RE = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
# Names Falcon sets in every pod; a spec may not override them.
RESERVED_ENV = frozenset(
    {
        "FALCON_TASK_ID",
        "FALCON_POD_NAME",
        "FALCON_LOG_DIR",
        "TPU_WORKER_ID",
        "TPU_WORKER_HOSTNAMES",
        "JOB_COMPLETION_INDEX",
        "MEGASCALE_COORDINATOR_ADDRESS",
    }
)


class SupplyMode(StrEnum):
    RESERVATION = "reservation"
    ON_DEMAND = "on-demand"
    FLEX_START = "flex-start"


class SpecError(ValueError):
    """The spec is not acceptable; the message says which field and why."""


class TaskSpec(BaseModel):
    """What a task asks for. Frozen; unknown fields are an error."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False)

    tpu_type: str
    topology: str
    image: str
    command: list[str] = Field(default_factory=list)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    supply_mode: SupplyMode | None = None
    timeout_seconds: int = Field(default=DEFAULT_TIMEOUT_SECONDS)
    # Higher first (original, Phase 4); FIFO per actor and round robin within one priority.
    priority: int = Field(default=0, ge=-100, le=100, strict=True)
    # How many times Falcon re-runs the task after the fleet (not the task) ended a run:
    # host maintenance, node repair, reclaimed capacity. None: Settings.max_recoveries; 0: never.
    max_recoveries: int | None = Field(default=None, ge=0, le=MAX_RECOVERIES, strict=True)
    # Seconds after its submission (``jobs.created_at``) by which the task must have reached
    # Running for the first time; past it a task that has not is ended Failed/StartDeadlineExceeded
    # (``start_deadline_at``). None: it waits as long as its waits' own limits allow.
    start_deadline_s: float | None = None
    working_dir: str | None = None
    cpu: str | None = None
    memory: str | None = None

    @field_validator("supply_mode", mode="before")
    @classmethod
    def _empty_supply_mode(cls, v: Any) -> Any:
        if v is None or v == "":
            return None
        # check the type first: an unhashable value (list, object) must not reach the set lookup
        if not isinstance(v, str) or v not in {m.value for m in SupplyMode}:
            raise ValueError(f"must be one of {', '.join(m.value for m in SupplyMode)} or empty, got {v!r:.60}")
        return v

    @field_validator("tpu_type")
    @classmethod
    def _tpu_type(cls, v: str) -> str:
        if v not in tpu.tpu_types():
            raise ValueError(f"unknown TPU type {v!r}; allowed: {', '.join(tpu.tpu_types())}")
        return v

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        if len(v) > MAX_IMAGE_LEN or not _IMAGE_RE.match(v):
            raise ValueError(f"malformed container image reference {v[:80]!r}")
        return v

    @field_validator("command", "args")
    @classmethod
    def _argv(cls, v: list[str]) -> list[str]:
        if len(v) > MAX_ARGV_ITEMS:
            raise ValueError(f"at most {MAX_ARGV_ITEMS} items, got {len(v)}")
        if sum(len(s.encode()) for s in v) > MAX_ARGV_BYTES:
            raise ValueError(f"at most {MAX_ARGV_BYTES} bytes in all")
        if any("\x00" in s for s in v):
            raise ValueError("NUL bytes are not allowed")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_ENV_ITEMS:
            raise ValueError(f"at most {MAX_ENV_ITEMS} variables, got {len(v)}")
        for name in v:
            if not _ENV_NAME_RE.match(name):
                raise ValueError(
                    f"invalid variable name {name[:64]!r}: letters, digits, '_', '-' or '.', not starting with a digit"
                )
            if name in RESERVED_ENV:
                raise ValueError(f"variable {name} is set by Falcon and cannot be overridden")
        if sum(len(k.encode()) + len(x.encode()) for k, x in v.items()) > MAX_ENV_BYTES:
            raise ValueError(f"at most {MAX_ENV_BYTES} bytes in all")
        if any("\x00" in x for x in v.values()):
            raise ValueError("NUL bytes are not allowed")
        return v

    @field_validator("timeout_seconds", mode="before")
    @classmethod
    def _timeout(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError("must be a whole number of seconds")
        if not 1 <= v <= MAX_TIMEOUT_SECONDS:
            raise ValueError(f"must be between 1 and {MAX_TIMEOUT_SECONDS} seconds, got {v}")
        return v

    @field_validator("start_deadline_s", mode="before")
    @classmethod
    def _start_deadline(cls, v: Any) -> Any:
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise ValueError("must be a number of seconds (or null for none)")
        if not 0 < v <= MAX_START_DEADLINE_SECONDS:
            raise ValueError(f"must be more than 0 and at most {MAX_START_DEADLINE_SECONDS} seconds, got {v:g}")
        return float(v)

    @field_validator("working_dir")
    @classmethod
    def _working_dir(cls, v: str | None) -> str | None:
        if v is not None and (not v.startswith("/") or len(v) > 1024 or "\x00" in v):
            raise ValueError("must be an absolute path of at most 1024 characters")
        return v

    @field_validator("cpu", "memory")
    @classmethod
    def _quantity(cls, v: str | None) -> str | None:
        if v is not None and (len(v) > 32 or not _QUANTITY_RE.match(v)):
            raise ValueError(f"not a Kubernetes quantity: {v[:40]!r} (e.g. 4, 500m, 16Gi)")
        return v

    @model_validator(mode="after")
    def _shape(self) -> TaskSpec:
        try:
            tpu.lookup(self.tpu_type, self.topology)
        except tpu.UnknownShape as e:
            raise ValueError(f"topology: {e}") from None
        if not self.command and not self.args:
            raise ValueError("command: give a command (or args for the image's entrypoint)")
        return self

    @property
    def shape(self) -> tpu.SliceShape:
        return tpu.lookup(self.tpu_type, self.topology)

    def start_deadline_at(self, created_at: dt.datetime) -> dt.datetime | None:
        """When a task of this spec submitted at ``created_at`` must have started (reached
        Running) by; None without a ``start_deadline_s``."""
        if self.start_deadline_s is None:
            return None
        return created_at + dt.timedelta(seconds=self.start_deadline_s)


def _loc_part(x: Any) -> str:
    """One step of an error's path: a plain name as is, any other key quoted and cut."""
    if isinstance(x, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]{0,63}", x) or isinstance(x, int):
        return str(x)
    return repr(str(x)[:40])


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors(include_url=False):
        loc = ".".join(_loc_part(x) for x in e["loc"]) or "spec"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field (not allowed in a task spec)"
            if loc.startswith("'"):  # an empty, long or odd name is quoted: say where it is
                loc = f"spec.{loc}"
        elif e["type"] == "missing":
            msg = "required field is missing"
        if not e["loc"] and re.match(r"^[a-z_]+: ", msg):
            parts.append(msg)  # a whole-spec check that already names its field
        else:
            parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


def parse_spec(raw: str | bytes | dict[str, Any] | Any) -> TaskSpec:
    """Parse and validate a stored spec; raises SpecError only."""
    try:
        data = json.loads(raw) if isinstance(raw, str | bytes | bytearray) else raw
    except (ValueError, RecursionError) as e:
        raise SpecError(f"spec: not valid JSON ({e.__class__.__name__}: {str(e)[:120]})") from None
    if not isinstance(data, dict):
        raise SpecError(f"spec: must be a JSON object, got {type(data).__name__}")
    try:
        return TaskSpec.model_validate(data)
    except ValidationError as e:
        raise SpecError(_describe(e)) from None
    except (ValueError, TypeError, RecursionError) as e:  # defensive: never let another type escape
        raise SpecError(f"spec: {str(e)[:200]}") from None
