"""What a task or coordinator process of a cluster job reads from its environment (`from_env`), and
what its parent writes there (`NodeEnv`): the one codec of these variables.

The operator (and `nopstream run --etcd`) sets these on every pod (process):
  NOPSTREAM_PLAN_DIR    directory holding partitioned.json and deployment.json
  NOPSTREAM_ETCD        etcd endpoint host:port
  NOPSTREAM_ATTEMPT     this process's unique name (the pod name)
  NOPSTREAM_TASK_ID     the task this process runs (tasks only)
  NOPSTREAM_RUN         the run this task belongs to (tasks only)
  NOPSTREAM_STANDBY     "true": a standby task, made before its run began (`Registry.serves`)
  NOPSTREAM_RESIDENT    "true": a pod's task process, kept across runs (`node.resident`)
  NOPSTREAM_HOST        address to listen on (default 127.0.0.1; 0.0.0.0 in a pod)
  NOPSTREAM_ADVERTISE   address others reach this process at (the pod IP; default the host)
  NOPSTREAM_PORT        port to listen on (default 0: any free port)
  NOPSTREAM_HEALTH_PORT port of the liveness endpoint (`node.liveness`; default none)
  NOPSTREAM_LEASE_TTL   seconds of the process's etcd lease (default 10)
  NOPSTREAM_SECRET_FILE the file holding the job's secret (`node.wire.guard`; default SECRET_FILE)
  NOPSTREAM_TLS         "true": the job speaks TLS; its files sit beside the secret (`node.wire.tls`)
  NOPSTREAM_ETCD_ACCESS a directory: TLS and credentials to etcd (`cluster.etcd_access`)
  NOPSTREAM_PARENT_PID  the process ends when this one, its parent, does (local supervisors only)
Every task process, of any runner, also reads (`tasklife.task_settings`):
  NOPSTREAM_BATCH_SIZE  the most records a source reads at once (default 1000; its first read)
  NOPSTREAM_BATCH_TARGET_MS  how long one source batch may hold the task's event loop (default 50)
  NOPSTREAM_SOURCE_PAUSE_MS  a source's pause after each batch (default 0; `nopstream chaos --pace`)
Lower both when slow user functions make checkpoints slow: a barrier waits for the batch
before it, and its commands for each batch while the event loop is held.
S3 credentials: `nopstream.s3.credentials`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nopstream.cluster.etcd_access import ACCESS_ENV, AccessError, EtcdAccess, access_from_env
from nopstream.model.errors import ModelError
from nopstream.node.wire.guard import SecretError, read_secret
from nopstream.node.wire.tls import JobTls, TlsError
from nopstream.plan import compiler
from nopstream.plan.partitioned import PartitionedPlan

PARTITIONED_FILE = "partitioned.json"
DEPLOYMENT_FILE = "deployment.json"
SECRET_FILE = "/var/run/nopstream/job-secret/secret"
"""Where a pod finds its job's secret: the operator mounts the job's Secret there."""


PLAN_DIR = "NOPSTREAM_PLAN_DIR"
ETCD = "NOPSTREAM_ETCD"
ATTEMPT = "NOPSTREAM_ATTEMPT"
TASK_ID = "NOPSTREAM_TASK_ID"
RUN = "NOPSTREAM_RUN"
STANDBY = "NOPSTREAM_STANDBY"
RESIDENT = "NOPSTREAM_RESIDENT"
HOST = "NOPSTREAM_HOST"
ADVERTISE = "NOPSTREAM_ADVERTISE"
PORT = "NOPSTREAM_PORT"
HEALTH = "NOPSTREAM_HEALTH_PORT"
LEASE_TTL = "NOPSTREAM_LEASE_TTL"
SECRET = "NOPSTREAM_SECRET_FILE"
TLS = "NOPSTREAM_TLS"
ETCD_ACCESS = ACCESS_ENV
PARENT = "NOPSTREAM_PARENT_PID"


class SettingsError(ValueError):
    """A variable of the environment is missing or malformed; the message names it."""


@dataclass(frozen=True)
class NodeSettings:
    """Identity and bindings of one process of a cluster job."""

    plan_dir: Path
    etcd_host: str
    etcd_port: int
    attempt: str
    host: str
    advertise: str
    port: int
    lease_ttl: int
    secret: str = field(repr=False)
    etcd_access: EtcdAccess | None = None
    tls: JobTls | None = None
    task_id: str | None = None
    run: int | None = None
    standby: bool = False
    resident: bool = False
    health_port: int | None = None
    parent: int | None = None

    @property
    def partitioned_path(self) -> Path:
        """The PartitionedPlan document."""
        return self.plan_dir / PARTITIONED_FILE

    @property
    def deployment_path(self) -> Path:
        """The DeploymentPlan document."""
        return self.plan_dir / DEPLOYMENT_FILE


@dataclass(frozen=True)
class NodeEnv:
    """The variables a parent sets for a task or coordinator process it starts; `from_env` reads them
    back. One left None is not set (a pod takes its attempt and addresses from its own fields)."""

    plan_dir: str
    etcd: str
    lease_ttl: int
    secret_file: str
    tls: bool = False
    etcd_access: str | None = None
    attempt: str | None = None
    port: int | None = None
    health_port: int | None = None
    task_id: str | None = None
    run: int | None = None
    standby: bool = False
    resident: bool = False
    parent: int | None = None

    def to_env(self) -> dict[str, str]:
        """The variables, by name."""
        values: dict[str, object] = {
            PLAN_DIR: self.plan_dir,
            ETCD: self.etcd,
            ATTEMPT: self.attempt,
            PORT: self.port,
            HEALTH: self.health_port,
            LEASE_TTL: self.lease_ttl,
            SECRET: self.secret_file,
            TLS: "true" if self.tls else None,
            ETCD_ACCESS: self.etcd_access,
            TASK_ID: self.task_id,
            RUN: self.run,
            STANDBY: "true" if self.standby else None,
            RESIDENT: "true" if self.resident else None,
            PARENT: self.parent,
        }
        return {name: str(value) for name, value in values.items() if value is not None}


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise SettingsError(f"{name} is not set (required)")
    return value


def int_variable(env: Mapping[str, str], name: str, default: int | None = None, *, minimum: int = 0) -> int:
    """The integer variable `name` (at least `minimum`), or `default` when unset; SettingsError names it."""
    raw = env.get(name, "").strip()
    if not raw:
        if default is None:
            raise SettingsError(f"{name} is not set (required)")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise SettingsError(f"{name}={value} must be at least {minimum}")
    return value


def _bool(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw not in ("", "true", "false"):
        raise SettingsError(f"{name}={raw!r} must be true or false")
    return raw == "true"


def _secret_file(env: Mapping[str, str]) -> Path:
    return Path(env.get(SECRET, "").strip() or SECRET_FILE)


def _secret(env: Mapping[str, str]) -> str:
    try:
        return read_secret(_secret_file(env))
    except SecretError as err:
        raise SettingsError(f"NOPSTREAM_SECRET_FILE: {err}") from None


def _etcd_access(env: Mapping[str, str]) -> EtcdAccess | None:
    try:
        return access_from_env(env)
    except AccessError as err:
        raise SettingsError(str(err)) from None


def _tls(env: Mapping[str, str]) -> JobTls | None:
    if not _bool(env, TLS):
        return None
    try:
        return JobTls.read(_secret_file(env).parent)
    except TlsError as err:
        raise SettingsError(f"NOPSTREAM_TLS: {err}") from None


def from_env(role: str, env: Mapping[str, str] = os.environ) -> NodeSettings:
    """The settings of a `task` or `coordinator` process; SettingsError names a bad variable."""
    plan_dir = Path(_required(env, PLAN_DIR))
    for name in (PARTITIONED_FILE, DEPLOYMENT_FILE):
        if not (plan_dir / name).is_file():
            raise SettingsError(f"NOPSTREAM_PLAN_DIR={plan_dir}: {name} is missing")
    etcd = _required(env, ETCD).removeprefix("http://")
    host, sep, port = etcd.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise SettingsError(f"NOPSTREAM_ETCD={etcd!r} must be host:port")
    listen = env.get(HOST, "").strip() or "127.0.0.1"
    settings = NodeSettings(
        plan_dir=plan_dir,
        etcd_host=host,
        etcd_port=int(port),
        attempt=_required(env, ATTEMPT),
        host=listen,
        advertise=env.get(ADVERTISE, "").strip() or listen,
        port=int_variable(env, PORT, 0),
        lease_ttl=int_variable(env, LEASE_TTL, 10, minimum=2),
        secret=_secret(env),
        tls=_tls(env),
        etcd_access=_etcd_access(env),
        health_port=int_variable(env, HEALTH, minimum=1) if env.get(HEALTH, "").strip() else None,
        parent=int_variable(env, PARENT, minimum=1) if env.get(PARENT, "").strip() else None,
    )
    if role == "task":
        task_id = _required(env, TASK_ID)
        try:
            known = compiler.read_document(settings.partitioned_path, PartitionedPlan).task_ids()
        except (OSError, ValueError, ModelError) as err:
            raise SettingsError(f"NOPSTREAM_PLAN_DIR={plan_dir}: {err}") from None
        if task_id not in known:
            shown = ", ".join(known[:3]) + (", ..." if len(known) > 3 else "")
            raise SettingsError(f"NOPSTREAM_TASK_ID={task_id!r} is not a task of the plan ({shown})")
        return dataclasses.replace(
            settings,
            task_id=task_id,
            run=int_variable(env, RUN, minimum=1),
            standby=_bool(env, STANDBY),
            resident=_bool(env, RESIDENT),
        )
    return settings
