"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, controller-manager, scheduler.

Certificates and service-account keys are generated per cluster; the API server runs
with RBAC authorization, an audit log of every write, and client-certificate
authentication; `kubeconfig` is an admin kubeconfig (group system:masters). No
kubelet runs: `e2e/agent.py` stands in for one. Every process is stopped by PID.

Use it from Python (`with Cluster.start(workdir) as cluster: ...`) or from a shell:
`python -m e2e.cluster up DIR` starts one and prints its kubeconfig path.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import yaml

from e2e import servers
from e2e.certs import KeyPair, Pki

SERVICE_CIDR = "10.96.0.0/24"
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "None", "verbs": ["get", "list", "watch"]},
        {"level": "None", "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}]},
        {"level": "Metadata"},
    ],
}


def write_kubeconfig(
    path: Path,
    *,
    server: str,
    ca: Path,
    user: str,
    client: KeyPair | None = None,
    token: str | None = None,
    namespace: str = "default",
) -> Path:
    """A kubeconfig for one user, by client certificate or bearer token."""
    creds: dict[str, str] = {}
    if client is not None:
        creds = {"client-certificate": str(client.cert), "client-key": str(client.key)}
    if token is not None:
        creds = {"token": token}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": user, "namespace": namespace}}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


@dataclass
class Cluster:
    """A running control plane and the files a client needs."""

    workdir: Path
    server: str
    kubeconfig: Path
    ca: Path
    audit_log: Path
    etcd: servers.Etcd
    processes: list[servers.Process] = field(default_factory=list)

    @classmethod
    def start(cls, workdir: Path, *, timeout: float = 120.0) -> Cluster:
        """Generate the PKI, start every component, and wait until /readyz answers ok."""
        workdir.mkdir(parents=True, exist_ok=True)
        pki = Pki(workdir / "pki")
        etcd = servers.start_etcd(workdir, name="kube-etcd")
        port = servers.free_port()
        server = f"https://127.0.0.1:{port}"
        cluster = cls(workdir, server, workdir / "admin.kubeconfig", pki.ca.cert, workdir / "audit.log", etcd)
        try:
            cluster._start_components(pki, port, timeout)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start_components(self, pki: Pki, port: int, timeout: float) -> None:
        serving = pki.issue(
            "apiserver",
            "kube-apiserver",
            client=False,
            server_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            server_ips=("127.0.0.1", "10.96.0.1"),
        )
        sa = pki.service_account_keys()
        admin = pki.issue("admin", "admin", orgs=("system:masters",))
        write_kubeconfig(self.kubeconfig, server=self.server, ca=self.ca, user="admin", client=admin)
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        apiserver = servers.spawn(
            "kube-apiserver",
            [
                servers.binary("kube-apiserver"),
                f"--etcd-servers={self.etcd.client_url}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--advertise-address=127.0.0.1",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={self.ca}",
                f"--service-account-key-file={sa.cert}",
                f"--service-account-signing-key-file={sa.key}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--authorization-mode=RBAC",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--profiling=false",
            ],
            log=self.workdir / "kube-apiserver.log",
        )
        self.processes.append(apiserver)
        servers.wait_until("kube-apiserver", self._readyz, process=apiserver, timeout=timeout)
        for name, cn, extra in (
            (
                "kube-controller-manager",
                "system:kube-controller-manager",
                [
                    f"--service-account-private-key-file={sa.key}",
                    f"--root-ca-file={self.ca}",
                    "--use-service-account-credentials=true",
                    f"--cluster-signing-cert-file={pki.ca.cert}",
                    f"--cluster-signing-key-file={pki.ca.key}",
                ],
            ),
            ("kube-scheduler", "system:kube-scheduler", []),
        ):
            client = pki.issue(name, cn)
            kubeconfig = write_kubeconfig(
                self.workdir / f"{name}.kubeconfig", server=self.server, ca=self.ca, user=name, client=client
            )
            self.processes.append(
                servers.spawn(
                    name,
                    [
                        servers.binary(name),
                        f"--kubeconfig={kubeconfig}",
                        f"--authentication-kubeconfig={kubeconfig}",
                        f"--authorization-kubeconfig={kubeconfig}",
                        "--bind-address=127.0.0.1",
                        f"--secure-port={servers.free_port()}",
                        "--leader-elect=false",
                        *extra,
                    ],
                    log=self.workdir / f"{name}.log",
                )
            )
        servers.wait_until("kube-controller-manager and kube-scheduler", self._components_up, timeout=timeout)

    def _readyz(self) -> bool:
        return self.kubectl("get", "--raw", "/readyz", check=False).stdout.strip() == "ok"

    def _components_up(self) -> bool:
        for proc in self.processes:
            if not proc.alive():
                raise servers.ServerError(f"{proc.name} exited\n{proc.tail()}")
        # The scheduler and the controller manager are up once they have read the API
        # server: the default service account of `default` is made by a controller.
        return self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster as admin."""
        return subprocess.run(
            [servers.binary("kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            check=check,
            input=input,
            timeout=timeout,
        )

    def start_agent(
        self, node: str = "agent-0", *, cwd: Path | None = None, timeout: float = 60.0
    ) -> servers.Process:
        """Start a process node agent (`e2e/agent.py`) as `node` and wait until the node is Ready.

        The agent acts with the admin credentials: it is test infrastructure, not a
        workload; the pods it runs get their own ServiceAccount tokens.
        """
        proc = servers.spawn(
            f"agent-{node}",
            [
                sys.executable,
                "-m",
                "e2e.agent",
                f"--kubeconfig={self.kubeconfig}",
                f"--node={node}",
                f"--workdir={self.workdir / 'agent' / node}",
                f"--cwd={cwd or Path.cwd()}",
            ],
            log=self.workdir / f"agent-{node}.log",
            cwd=Path(__file__).resolve().parent.parent,
        )
        self.processes.append(proc)

        def node_ready() -> bool:
            out = self.kubectl(
                "get",
                "node",
                node,
                "-o",
                "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
                check=False,
            )
            return out.stdout.strip() == "True"

        servers.wait_until(f"agent {node}", node_ready, process=proc, timeout=timeout)
        return proc

    def audit_writes(self) -> list[dict[str, object]]:
        """Every write the API server has audited (create, update, patch, delete), oldest first."""
        if not self.audit_log.exists():
            return []
        events = [json.loads(line) for line in self.audit_log.read_text().splitlines() if line.strip()]
        return [
            e for e in events if e.get("verb") in ("create", "update", "patch", "delete", "deletecollection")
        ]

    def stop(self) -> None:
        """Stop every component by PID, newest first, then etcd."""
        for proc in reversed(self.processes):
            proc.stop()
        self.etcd.stop()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def main() -> None:
    """`python -m e2e.cluster up DIR`: run a cluster until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("command", choices=["up"])
    parser.add_argument("workdir", type=Path)
    args = parser.parse_args()
    with Cluster.start(args.workdir) as cluster:
        print(f"KUBECONFIG={cluster.kubeconfig}", flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
    sys.exit(0)


if __name__ == "__main__":
    main()
