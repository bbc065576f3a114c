"""A process node agent: test infrastructure standing in for a kubelet and a container runtime.

It registers a Node, keeps its Lease fresh, and runs every pod scheduled to that node
as local processes: each container's `command` + `args` (the image is ignored; the
processes run from this virtualenv), with env from values, the downward API
(`fieldRef`), Secrets and ConfigMaps. A pod gets its own loopback address 127.0.0.N
as its pod IP, ConfigMap, Secret and emptyDir volumes as files in the pod's directory
(with no mount namespace, an env value naming a mount path is rewritten to that
directory), and the credentials of its ServiceAccount (a token from the
TokenRequest API, in a kubeconfig named by `KUBECONFIG`), so RBAC applies to it as in
a real cluster. It reports phase, container states, restart counts and exit codes,
runs httpGet/tcpSocket/exec readiness and liveness probes, restarts containers by
the pod's restartPolicy, and honours deletion with its grace period (SIGTERM, then
SIGKILL). For fault tests, setting the annotation `e2e.nopstream.io/kill` to
`SIGNAL:NONCE` (e.g. `KILL:1`) sends SIGNAL to the pod's processes once per nonce.

Run: `python -m e2e.agent --kubeconfig K --node NAME --workdir DIR`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

log = logging.getLogger("agent")

KILL_ANNOTATION = "e2e.nopstream.io/kill"
_VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def now() -> str:
    """The current time in RFC 3339, as Kubernetes writes it."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_now() -> str:
    """The current time as a Kubernetes MicroTime."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class IpPool:
    """Loopback pod IPs 127.0.0.2 .. 127.0.0.254, lowest free first."""

    def __init__(self) -> None:
        """An empty pool."""
        self._used: set[int] = set()
        self._lock = threading.Lock()

    def allocate(self) -> str:
        """Take the lowest free address."""
        with self._lock:
            n = next(i for i in range(2, 255) if i not in self._used)
            self._used.add(n)
            return f"127.0.0.{n}"

    def release(self, ip: str) -> None:
        """Give an address back."""
        with self._lock:
            self._used.discard(int(ip.rsplit(".", 1)[1]))


@dataclass
class Container:
    """One container of a pod and its current process."""

    spec: dict[str, Any]
    env: dict[str, str]
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    ready: bool = False
    started_at: str | None = None
    last_exit: tuple[int, str, str] | None = None  # (code, startedAt, finishedAt)
    state: dict[str, Any] = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    liveness_failures: int = 0

    @property
    def name(self) -> str:
        """The container's name."""
        return str(self.spec["name"])


class PodRunner(threading.Thread):
    """Runs one pod's containers as processes and reports their state."""

    def __init__(self, agent: Agent, pod: dict[str, Any]) -> None:
        """Prepare to run `pod` (a plain-dict Pod)."""
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}-{meta['name']}", daemon=True)
        self.agent = agent
        self.pod = pod
        self.ns, self.pod_name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.dir = agent.workdir / "pods" / f"{self.ns}_{self.pod_name}_{self.uid[:8]}"
        self.ip = ""
        self.containers: list[Container] = []
        self.deleting = threading.Event()
        self.grace = 30.0
        self.kills_done: set[str] = set()
        self.lock = threading.Lock()

    # --- life cycle -------------------------------------------------------------

    def run(self) -> None:
        """Start the containers, supervise them, and clean up on deletion."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.ip = self.agent.ips.allocate()
            kubeconfig = self._service_account_kubeconfig()
            self._materialize_volumes()
            if not self._run_init_containers(kubeconfig):
                return
            for spec in self.pod["spec"]["containers"]:
                self.containers.append(self._container(spec, kubeconfig))
            for c in self.containers:
                self._start(c)
            self._report()
            self._supervise()
        except Exception as exc:  # a pod that cannot start is reported, the agent goes on
            log.exception("pod %s/%s failed to start", self.ns, self.pod_name)
            self._patch_status({"phase": "Failed", "reason": "AgentError", "message": str(exc)[:500]})
        finally:
            self._stop_all(self.grace if self.deleting.is_set() else 0)
            if self.deleting.is_set():
                self.finalize_delete()
            if self.ip:
                self.agent.ips.release(self.ip)

    def request_delete(self, grace: float) -> None:
        """Begin graceful termination (deletionTimestamp was set)."""
        self.grace = grace
        self.deleting.set()

    def request_kill(self, value: str) -> None:
        """Send the signal named in a kill annotation `SIGNAL:NONCE`, once per nonce."""
        if value in self.kills_done:
            return
        self.kills_done.add(value)
        sig_name = value.split(":", 1)[0].upper()
        sig = getattr(signal, sig_name if sig_name.startswith("SIG") else f"SIG{sig_name}", signal.SIGKILL)
        with self.lock:
            for c in self.containers:
                if c.popen is not None and c.popen.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(c.popen.pid, sig)

    # --- preparation --------------------------------------------------------------

    def _service_account_kubeconfig(self) -> Path | None:
        spec = self.pod["spec"]
        if spec.get("automountServiceAccountToken") is False:
            return None
        sa = spec.get("serviceAccountName") or "default"
        request = {
            "spec": {
                "audiences": [],
                "expirationSeconds": 3600 * 6,
                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": self.pod_name, "uid": self.uid},
            }
        }
        token = self.agent.core.create_namespaced_service_account_token(sa, self.ns, request).status.token
        path = self.dir / "kubeconfig"
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "c",
                    "cluster": {"server": self.agent.server, "certificate-authority": self.agent.ca},
                }
            ],
            "users": [{"name": sa, "user": {"token": token}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": sa, "namespace": self.ns}}],
            "current-context": "c",
        }
        path.write_text(yaml.safe_dump(kubeconfig))
        path.chmod(0o600)
        return path

    def _materialize_volumes(self) -> None:
        """ConfigMap and Secret volumes become files under the pod's directory (no mount namespaces)."""
        import base64

        for volume in self.pod["spec"].get("volumes") or []:
            target = self.dir / "volumes" / volume["name"]
            target.mkdir(parents=True, exist_ok=True)
            if "configMap" in volume:
                cm = self.agent.core.read_namespaced_config_map(volume["configMap"]["name"], self.ns)
                files = dict(cm.data or {})
            elif "secret" in volume:
                secret = self.agent.core.read_namespaced_secret(volume["secret"]["secretName"], self.ns)
                files = {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
            elif "emptyDir" in volume or "projected" in volume:
                files = {}  # projected: the service-account token comes through KUBECONFIG instead
            else:
                raise ValueError(
                    f"volume {volume['name']}: only configMap, secret and emptyDir are supported"
                )
            for key, text in files.items():
                (target / key).write_text(text)

    def _mounts(self, spec: dict[str, Any]) -> dict[str, str]:
        """A container's ConfigMap and Secret mount paths and the pod directories standing in for them.

        An emptyDir (a scratch `/tmp`) is left to the process's own filesystem: rewriting
        paths under it would move files the test itself passes in (a KUBECONFIG in /tmp).
        """
        scratch = {v["name"] for v in self.pod["spec"].get("volumes") or [] if "emptyDir" in v}
        return {
            m["mountPath"].rstrip("/"): str(self.dir / "volumes" / m["name"])
            for m in spec.get("volumeMounts") or []
            if m["name"] not in scratch
        }

    def _field(self, path: str) -> str:
        meta, spec = self.pod["metadata"], self.pod["spec"]
        m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
        if m:
            return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
        values = {
            "metadata.name": meta["name"],
            "metadata.namespace": meta["namespace"],
            "metadata.uid": meta["uid"],
            "spec.nodeName": spec.get("nodeName", ""),
            "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
            "status.podIP": self.ip,
            "status.podIPs": self.ip,
            "status.hostIP": "127.0.0.1",
            "status.hostIPs": "127.0.0.1",
        }
        if path not in values:
            raise ValueError(f"fieldRef {path} is not supported by the agent")
        return str(values[path])

    def _key_ref(self, kind: str, ref: dict[str, Any]) -> str | None:
        try:
            if kind == "secret":
                data = self.agent.core.read_namespaced_secret(ref["name"], self.ns).data or {}
                import base64

                raw = data.get(ref["key"])
                return None if raw is None else base64.b64decode(raw).decode()
            cm = self.agent.core.read_namespaced_config_map(ref["name"], self.ns).data or {}
            return cm.get(ref["key"])
        except ApiException as exc:
            if exc.status == 404 and ref.get("optional"):
                return None
            raise

    def _container(self, spec: dict[str, Any], kubeconfig: Path | None) -> Container:
        env: dict[str, str] = {
            "PATH": f"{self.agent.bin_dir}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.dir),
            "HOSTNAME": self.pod_name,
            "LANG": "C.UTF-8",
        }
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        for source in spec.get("envFrom") or []:
            prefix = source.get("prefix", "")
            if "configMapRef" in source:
                data = self.agent.core.read_namespaced_config_map(
                    source["configMapRef"]["name"], self.ns
                ).data
                env.update({prefix + k: v for k, v in (data or {}).items()})
            if "secretRef" in source:
                import base64

                data = self.agent.core.read_namespaced_secret(source["secretRef"]["name"], self.ns).data
                env.update({prefix + k: base64.b64decode(v).decode() for k, v in (data or {}).items()})
        for item in spec.get("env") or []:
            value: str | None
            if "value" in item:
                value = _VAR_REF.sub(lambda m: env.get(m.group(1), m.group(0)), str(item["value"]))
            else:
                source = item.get("valueFrom") or {}
                if "fieldRef" in source:
                    value = self._field(source["fieldRef"]["fieldPath"])
                elif "secretKeyRef" in source:
                    value = self._key_ref("secret", source["secretKeyRef"])
                elif "configMapKeyRef" in source:
                    value = self._key_ref("configmap", source["configMapKeyRef"])
                else:
                    value = ""
            if value is not None:
                env[item["name"]] = value
        # No mount namespace: a value naming a mount path names the pod directory instead.
        for mount, local in self._mounts(spec).items():
            for key, value in env.items():
                if value == mount or value.startswith(mount + "/"):
                    env[key] = local + value[len(mount) :]
        return Container(spec, env, self.dir / f"{spec['name']}.log")

    # --- processes -----------------------------------------------------------------

    def _argv(self, c: Container) -> list[str]:
        argv = [*(c.spec.get("command") or []), *(c.spec.get("args") or [])]
        if not c.spec.get("command"):
            raise ValueError(f"container {c.name}: the agent needs an explicit command (images are ignored)")
        return [_VAR_REF.sub(lambda m: c.env.get(m.group(1), m.group(0)), a) for a in argv]

    def _start(self, c: Container) -> None:
        with open(c.log_path, "ab") as out:
            c.popen = subprocess.Popen(
                self._argv(c),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=c.env,
                cwd=c.spec.get("workingDir") or self.agent.cwd,
                start_new_session=True,
            )
        c.started_at = now()
        c.state = {"running": {"startedAt": c.started_at}}
        c.ready = not c.spec.get("readinessProbe")
        c.liveness_failures = 0
        log.info("pod %s/%s container %s started as pid %d", self.ns, self.pod_name, c.name, c.popen.pid)

    def _run_init_containers(self, kubeconfig: Path | None) -> bool:
        for spec in self.pod["spec"].get("initContainers") or []:
            c = self._container(spec, kubeconfig)
            self._start(c)
            assert c.popen is not None
            while c.popen.poll() is None:
                if self.deleting.wait(0.2):
                    return False
            if c.popen.returncode != 0:
                self._patch_status(
                    {
                        "phase": "Failed",
                        "reason": "InitContainerFailed",
                        "message": f"init container {c.name} exited {c.popen.returncode}",
                    }
                )
                return False
        return True

    @staticmethod
    def _termination_message(c: Container, code: int) -> dict[str, str]:
        """The kubelet's FallbackToLogsOnError: a failed container's last log lines (at most 2 KiB)."""
        if code == 0 or c.spec.get("terminationMessagePolicy") != "FallbackToLogsOnError":
            return {}
        lines = c.log_path.read_text(errors="replace").splitlines()[-80:]
        return {"message": "\n".join(lines)[-2048:]}

    def _supervise(self) -> None:
        policy = self.pod["spec"].get("restartPolicy", "Always")
        next_probe: dict[tuple[str, str], float] = {}
        backoff: dict[str, float] = {}
        while not self.deleting.is_set():
            changed = False
            for c in self.containers:
                if c.popen is None:
                    continue
                code = c.popen.poll()
                if code is not None and "running" in c.state:
                    c.last_exit = (code, c.state["running"]["startedAt"], now())
                    c.state = {
                        "terminated": {
                            "exitCode": code,
                            "reason": "Completed" if code == 0 else "Error",
                            "startedAt": c.last_exit[1],
                            "finishedAt": c.last_exit[2],
                            **self._termination_message(c, code),
                        }
                    }
                    c.ready = False
                    changed = True
                    if policy == "Always" or (policy == "OnFailure" and code != 0):
                        delay = min(10.0, backoff.get(c.name, 0.5) * 2)
                        backoff[c.name] = delay
                        c.state = {"waiting": {"reason": "CrashLoopBackOff" if code else "Completed"}}
                        next_probe[(c.name, "restart")] = time.monotonic() + delay
                restart_at = next_probe.get((c.name, "restart"))
                if "waiting" in c.state and restart_at is not None and time.monotonic() >= restart_at:
                    del next_probe[(c.name, "restart")]
                    c.restarts += 1
                    self._start(c)
                    changed = True
                if "running" in c.state:
                    changed |= self._probe(c, next_probe)
            if changed:
                self._report()
            if all("terminated" in c.state for c in self.containers):
                return
            self.deleting.wait(0.2)

    def _probe(self, c: Container, next_probe: dict[tuple[str, str], float]) -> bool:
        changed = False
        for kind in ("readinessProbe", "livenessProbe"):
            probe = c.spec.get(kind)
            if not probe:
                continue
            key = (c.name, kind)
            t = time.monotonic()
            if key not in next_probe:
                next_probe[key] = t + float(probe.get("initialDelaySeconds", 0))
            if t < next_probe[key]:
                continue
            next_probe[key] = t + float(probe.get("periodSeconds", 10))
            ok = self._check(c, probe)
            if kind == "readinessProbe" and ok != c.ready:
                c.ready, changed = ok, True
            if kind == "livenessProbe":
                c.liveness_failures = 0 if ok else c.liveness_failures + 1
                if c.liveness_failures >= int(probe.get("failureThreshold", 3)) and c.popen is not None:
                    log.info(
                        "pod %s/%s container %s failed liveness; killing", self.ns, self.pod_name, c.name
                    )
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(c.popen.pid, signal.SIGKILL)
        return changed

    def _port(self, c: Container, port: Any) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for p in c.spec.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        raise ValueError(f"unknown named port {port}")

    def _check(self, c: Container, probe: dict[str, Any]) -> bool:
        timeout = float(probe.get("timeoutSeconds", 1))
        try:
            if "httpGet" in probe:
                h = probe["httpGet"]
                url = f"http://{self.ip}:{self._port(c, h['port'])}{h.get('path', '/')}"
                with urllib.request.urlopen(url, timeout=timeout) as resp:
                    return 200 <= resp.status < 400
            if "tcpSocket" in probe:
                with socket.create_connection((self.ip, self._port(c, probe["tcpSocket"]["port"])), timeout):
                    return True
            if "exec" in probe:
                return (
                    subprocess.run(
                        probe["exec"]["command"],
                        env=c.env,
                        timeout=timeout + 5,
                        capture_output=True,
                        check=False,
                    ).returncode
                    == 0
                )
        except (OSError, ValueError, subprocess.TimeoutExpired):
            return False
        return True

    def _stop_all(self, grace: float) -> None:
        with self.lock:
            running = [c.popen for c in self.containers if c.popen is not None and c.popen.poll() is None]
            for p in running:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            for p in running:
                try:
                    p.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(p.pid, signal.SIGKILL)
                    p.wait(10)

    def finalize_delete(self) -> None:
        """Remove the pod object for good, as a kubelet does once its containers are gone."""
        body = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=self.uid)
        )
        with contextlib.suppress(ApiException):
            self.agent.core.delete_namespaced_pod(self.pod_name, self.ns, body=body)

    # --- status --------------------------------------------------------------------

    def _report(self) -> None:
        statuses = []
        for c in self.containers:
            status: dict[str, Any] = {
                "name": c.name,
                "image": c.spec.get("image", ""),
                "imageID": "",
                "containerID": f"agent://{c.popen.pid}" if c.popen else "",
                "ready": c.ready,
                "started": "running" in c.state,
                "restartCount": c.restarts,
                "state": c.state,
            }
            if c.last_exit is not None and "terminated" not in c.state:
                code, started, finished = c.last_exit
                status["lastState"] = {
                    "terminated": {
                        "exitCode": code,
                        "startedAt": started,
                        "finishedAt": finished,
                        "reason": "Completed" if code == 0 else "Error",
                    }
                }
            statuses.append(status)
        terminated = [c for c in self.containers if "terminated" in c.state]
        if self.containers and len(terminated) == len(self.containers):
            codes = [c.state["terminated"]["exitCode"] for c in terminated]
            phase = "Succeeded" if all(code == 0 for code in codes) else "Failed"
        else:
            phase = "Running"
        ready = bool(self.containers) and all(c.ready for c in self.containers)
        t = now()
        conditions = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": t},
            {"type": "Initialized", "status": "True", "lastTransitionTime": t},
            {"type": "ContainersReady", "status": str(ready), "lastTransitionTime": t},
            {"type": "Ready", "status": str(ready), "lastTransitionTime": t},
        ]
        self._patch_status(
            {
                "phase": phase,
                "podIP": self.ip,
                "podIPs": [{"ip": self.ip}],
                "hostIP": "127.0.0.1",
                "hostIPs": [{"ip": "127.0.0.1"}],
                "startTime": self.pod.get("status", {}).get("startTime") or t,
                "conditions": conditions,
                "containerStatuses": statuses,
            }
        )

    def _patch_status(self, status: dict[str, Any]) -> None:
        with contextlib.suppress(ApiException):
            self.agent.core.patch_namespaced_pod_status(self.pod_name, self.ns, {"status": status})


class Agent:
    """Registers a node and runs the pods scheduled to it."""

    def __init__(self, kubeconfig: Path, node: str, workdir: Path, *, cwd: Path) -> None:
        """Connect to the API server of `kubeconfig` as the node `node`."""
        self.api = config.new_client_from_config(str(kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.coordination = client.CoordinationV1Api(self.api)
        kc = yaml.safe_load(kubeconfig.read_text())
        self.server = kc["clusters"][0]["cluster"]["server"]
        self.ca = kc["clusters"][0]["cluster"]["certificate-authority"]
        self.node = node
        self.workdir = workdir
        self.cwd = cwd
        self.bin_dir = str(Path(sys.executable).parent)
        self.ips = IpPool()
        self.pods: dict[str, PodRunner] = {}
        self.stopping = threading.Event()

    def register(self) -> None:
        """Create (or refresh) the Node and mark it Ready."""
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node,
                "labels": {
                    "kubernetes.io/hostname": self.node,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "nopstream.io/agent": "process",
                },
            },
        }
        try:
            self.core.create_node(node)
        except ApiException as exc:
            if exc.status != 409:
                raise
        self._heartbeat()

    def _heartbeat(self) -> None:
        t = now()
        capacity = {"cpu": "32", "memory": "64Gi", "pods": "250", "ephemeral-storage": "100Gi"}
        status = {
            "capacity": capacity,
            "allocatable": capacity,
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.node},
            ],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "AgentReady",
                    "message": "process agent is running",
                    "lastHeartbeatTime": t,
                    "lastTransitionTime": t,
                },
                {
                    "type": "MemoryPressure",
                    "status": "False",
                    "lastHeartbeatTime": t,
                    "lastTransitionTime": t,
                },
                {"type": "DiskPressure", "status": "False", "lastHeartbeatTime": t, "lastTransitionTime": t},
                {"type": "PIDPressure", "status": "False", "lastHeartbeatTime": t, "lastTransitionTime": t},
            ],
            "nodeInfo": {
                "machineID": "agent",
                "systemUUID": "agent",
                "bootID": "agent",
                "kernelVersion": os.uname().release,
                "osImage": "nopstream process agent",
                "containerRuntimeVersion": "process://1",
                "kubeletVersion": "v1.35.4",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }
        self.core.patch_node_status(self.node, {"status": status})
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.node, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": self.node, "leaseDurationSeconds": 40, "renewTime": micro_now()},
        }
        try:
            self.coordination.replace_namespaced_lease(self.node, "kube-node-lease", lease)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.coordination.create_namespaced_lease("kube-node-lease", lease)

    def _heartbeats(self) -> None:
        while not self.stopping.wait(5):
            try:
                self._heartbeat()
            except Exception:
                log.exception("heartbeat failed")

    def run(self) -> None:
        """Register, then watch this node's pods until stopped."""
        self.register()
        threading.Thread(target=self._heartbeats, name="heartbeats", daemon=True).start()
        log.info("agent for node %s is up", self.node)
        while not self.stopping.is_set():
            try:
                self._watch()
            except Exception:
                if not self.stopping.is_set():
                    log.exception("pod watch failed; watching again")
                    time.sleep(1)

    def _watch(self) -> None:
        selector = f"spec.nodeName={self.node}"
        listing = self.api.sanitize_for_serialization(
            self.core.list_pod_for_all_namespaces(field_selector=selector)
        )
        for pod in listing.get("items", []):
            self._on_pod("ADDED", pod)
        version = listing["metadata"]["resourceVersion"]
        stream = watch.Watch().stream(
            self.core.list_pod_for_all_namespaces,
            field_selector=selector,
            resource_version=version,
            timeout_seconds=60,
        )
        for event in stream:
            if self.stopping.is_set():
                return
            raw = event.get("raw_object") or self.api.sanitize_for_serialization(event["object"])
            self._on_pod(event["type"], raw)

    def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        runner = self.pods.get(uid)
        if kind == "DELETED":
            if runner is not None:
                runner.request_delete(0)
            return
        if runner is None:
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                return
            if meta.get("deletionTimestamp"):
                body = client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)
                )
                with contextlib.suppress(ApiException):
                    self.core.delete_namespaced_pod(meta["name"], meta["namespace"], body=body)
                return
            runner = PodRunner(self, pod)
            self.pods[uid] = runner
            runner.start()
            return
        runner.pod = pod
        if meta.get("deletionTimestamp") and not runner.deleting.is_set():
            if runner.is_alive():
                runner.request_delete(float(meta.get("deletionGracePeriodSeconds") or 30))
            else:  # its processes are done already; only the API object is left
                runner.deleting.set()
                runner.finalize_delete()
        kill = (meta.get("annotations") or {}).get(KILL_ANNOTATION)
        if kill:
            runner.request_kill(kill)

    def shutdown(self) -> None:
        """Stop every pod's processes (SIGTERM, then SIGKILL) and stop watching."""
        self.stopping.set()
        for runner in list(self.pods.values()):
            runner.request_delete(2)
        for runner in list(self.pods.values()):
            runner.join(15)


def main() -> None:
    """Run the agent until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--node", default="agent-0")
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--cwd", type=Path, default=Path.cwd(), help="working directory of pod processes")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    agent = Agent(args.kubeconfig, args.node, args.workdir, cwd=args.cwd)
    done = threading.Event()

    def stop(*_: object) -> None:
        done.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    threading.Thread(target=agent.run, name="watch", daemon=True).start()
    done.wait()
    agent.shutdown()


if __name__ == "__main__":
    main()
