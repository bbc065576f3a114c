"""A one-node Kubernetes cluster inside a network namespace of the suite's own.

etcd, kube-apiserver, controller-manager, scheduler and the node (containerd, kubelet,
kube-proxy, CoreDNS: `e2e/node.py`) all run inside the namespace of `e2e/netns.py`.
Certificates and service-account keys are generated per cluster; the API server runs
with Node and RBAC authorization, an audit log of every write, and client-certificate
authentication. This machine reaches the API server, and any Service by its cluster
IP, through loopback forwards into the namespace (`e2e/forward.py`); `kubeconfig` is
an admin kubeconfig (group system:masters) through the API server's forward.
`stop` ends every process by PID, removes the node's cgroups, and the namespaces end
with their last process.

Use it from Python (`with Cluster.start(workdir) as cluster: ...`) or from a shell:
`python -m e2e.cluster up DIR` starts one and prints its kubeconfig path.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import yaml

from e2e import servers
from e2e.certs import Pki, write_kubeconfig
from e2e.netns import Namespace
from e2e.node import CLUSTER_DOMAIN, NODE_IP, NODE_NAME, Node, NodeCredentials, set_up_network
from nopstream.local.children import Child

SERVICE_CIDR = "10.96.0.0/24"
APISERVER_PORT = 6443
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


@dataclass
class Cluster:
    """A running one-node cluster and the files a client needs."""

    workdir: Path
    ns: Namespace
    pki: Pki
    kubeconfig: Path
    audit_log: Path
    server: str = ""
    node: Node | None = None
    processes: list[Child] = field(default_factory=list)

    @property
    def ca(self) -> Path:
        """The cluster CA certificate."""
        return self.pki.ca.cert

    @classmethod
    def start(cls, workdir: Path, *, timeout: float = 180.0) -> Cluster:
        """Create the namespace, start every component, and wait until the node is Ready."""
        workdir.mkdir(parents=True, exist_ok=True)
        ns = Namespace.create(workdir / "ns")
        cluster = cls(workdir, ns, Pki(workdir / "pki"), workdir / "admin.kubeconfig", workdir / "audit.log")
        try:
            set_up_network(ns)
            cluster._start_control_plane(timeout)
            cluster.node = Node.start(ns, workdir / "node", cluster._node_credentials())
            servers.wait_until("the node Ready", cluster._node_ready, timeout=timeout)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _inside_kubeconfig(self, name: str, cn: str, orgs: tuple[str, ...] = ()) -> Path:
        client = self.pki.issue(name, cn, orgs=orgs)
        return write_kubeconfig(
            self.workdir / f"{name}.kubeconfig",
            server=f"https://{NODE_IP}:{APISERVER_PORT}",
            ca=self.ca,
            user=name,
            client=client,
        )

    def _node_credentials(self) -> NodeCredentials:
        return NodeCredentials(
            ca=self.ca,
            kubelet=self._inside_kubeconfig("kubelet", f"system:node:{NODE_NAME}", ("system:nodes",)),
            kube_proxy=self._inside_kubeconfig("kube-proxy", "system:kube-proxy"),
            # CoreDNS is test infrastructure here, not a workload: it reads as admin
            coredns=self._inside_kubeconfig("coredns", "coredns", ("system:masters",)),
        )

    def _start_control_plane(self, timeout: float) -> None:
        pki = self.pki
        data = self.workdir / "etcd-data"
        etcd = servers.etcd_argv("kube-etcd", data, host="127.0.0.1", client=2379, peer=2380, metrics=2381)
        self.processes.append(
            self.ns.spawn("kube-etcd", etcd, log=self.workdir / "etcd.log", env=servers.ETCD_ENV)
        )
        serving = pki.issue(
            "apiserver",
            "kube-apiserver",
            client=False,
            server_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                f"kubernetes.default.svc.{CLUSTER_DOMAIN}",
            ),
            server_ips=("127.0.0.1", NODE_IP, "10.96.0.1"),
        )
        sa = pki.service_account_keys()
        kubelet_client = pki.issue(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", orgs=("system:masters",)
        )
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        apiserver = self.ns.spawn(
            "kube-apiserver",
            [
                servers.binary("kube-apiserver"),
                "--etcd-servers=http://127.0.0.1:2379",
                "--bind-address=0.0.0.0",  # the namespace's interfaces only
                f"--secure-port={APISERVER_PORT}",
                f"--advertise-address={NODE_IP}",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={self.ca}",
                f"--kubelet-client-certificate={kubelet_client.cert}",
                f"--kubelet-client-key={kubelet_client.key}",
                "--kubelet-preferred-address-types=InternalIP",
                f"--service-account-key-file={sa.cert}",
                f"--service-account-signing-key-file={sa.key}",
                f"--service-account-issuer=https://kubernetes.default.svc.{CLUSTER_DOMAIN}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--profiling=false",
            ],
            log=self.workdir / "kube-apiserver.log",
        )
        self.processes.append(apiserver)
        port = self.forward(NODE_IP, APISERVER_PORT)
        self.server = f"https://127.0.0.1:{port}"
        admin = pki.issue("admin", "admin", orgs=("system:masters",))
        write_kubeconfig(self.kubeconfig, server=self.server, ca=self.ca, user="admin", client=admin)
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
            kubeconfig = self._inside_kubeconfig(name, cn)
            self.processes.append(
                self.ns.spawn(
                    name,
                    [
                        servers.binary(name),
                        f"--kubeconfig={kubeconfig}",
                        f"--authentication-kubeconfig={kubeconfig}",
                        f"--authorization-kubeconfig={kubeconfig}",
                        "--bind-address=127.0.0.1",
                        "--leader-elect=false",
                        *extra,
                    ],
                    log=self.workdir / f"{name}.log",
                )
            )
        servers.wait_until("kube-controller-manager and kube-scheduler", self._components_up, timeout=timeout)

    def forward(self, host: str, port: int) -> int:
        """A loopback port of this machine that reaches `host:port` inside the namespace."""
        local = servers.free_port()
        proc = servers.spawn(
            f"forward-{host}-{port}",
            [
                sys.executable,
                "-m",
                "e2e.forward",
                f"--holder={self.ns.holder.pid}",
                f"--port={local}",
                f"--to={host}:{port}",
            ],
            log=self.workdir / "forwards.log",
            cwd=Path(__file__).resolve().parent.parent,
        )
        self.processes.append(proc)

        def listening() -> bool:
            with contextlib.closing(socket.socket()) as s:
                return s.connect_ex(("127.0.0.1", local)) == 0

        servers.wait_until(f"the forward to {host}:{port}", listening, process=proc, timeout=10)
        return local

    def service_port(self, name: str, port: int, namespace: str = "default") -> int:
        """A loopback port of this machine that reaches Service `name`'s `port` (by its cluster IP)."""
        ip = self.kubectl("get", "service", name, "-n", namespace, "-o", "jsonpath={.spec.clusterIP}").stdout
        return self.forward(ip.strip(), port)

    def _readyz(self) -> bool:
        return self.kubectl("get", "--raw", "/readyz", check=False).stdout.strip() == "ok"

    def _alive(self) -> None:
        for proc in [*self.processes, *(self.node.processes if self.node else [])]:
            if not proc.alive():
                raise servers.ServerError(f"{proc.name} exited\n{proc.tail(30)}")

    def _components_up(self) -> bool:
        self._alive()
        # The scheduler and the controller manager are up once they have read the API
        # server: the default service account of `default` is made by a controller.
        return self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0

    def _node_ready(self) -> bool:
        self._alive()
        out = self.kubectl(
            "get", "node", NODE_NAME, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
            check=False,
        )  # fmt: skip
        return out.stdout.strip() == "True"

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

    def audit_writes(self) -> list[dict[str, object]]:
        """Every write the API server has audited (create, update, patch, delete), oldest first."""
        if not self.audit_log.exists():
            return []
        events = [json.loads(line) for line in self.audit_log.read_text().splitlines() if line.strip()]
        return [
            e for e in events if e.get("verb") in ("create", "update", "patch", "delete", "deletecollection")
        ]

    def stop(self) -> None:
        """Stop the node (containers, cgroups), every component by PID, then the namespaces."""
        try:
            if self.node is not None:
                self.node.stop()
        finally:
            for proc in reversed(self.processes):
                proc.stop()
            self.ns.stop()

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
