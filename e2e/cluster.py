"""A Kubernetes cluster of two nodes (by default) inside network namespaces of the suite's own.

etcd, kube-apiserver, controller-manager, scheduler and node-0 (containerd, kubelet,
kube-proxy, CoreDNS: `e2e/node.py`) run inside the namespace of `e2e/netns.py`; every
other node runs in a namespace of its own linked to the nodes' bridge there. A worker
node can be lost (`kill_node`: every process of it at once) and started again
(`restart_node`) or cut off the bridge (`isolate_node`), and any addresses can be
partitioned from others by iptables rules in the nodes' namespaces (`cut`). The
controller manager calls a node lost once it has missed four of its lease renewals
(`NODE_MONITOR_GRACE`), not after the default 50 s.
Certificates and service-account keys are generated per cluster; the API server runs
with Node and RBAC authorization, an audit log of every write, and client-certificate
authentication. This machine reaches the API server, and any Service by its cluster
IP, through loopback forwards into the namespace (`e2e/forward.py`); `kubeconfig` is
an admin kubeconfig (group system:masters) through the API server's forward.
`stop` ends every process by PID, removes the nodes' cgroups, and the namespaces end
with their last process.

Use it from Python (`with Cluster.start(workdir) as cluster: ...`) or from a shell:
`python -m e2e.cluster up DIR [--nodes N]` starts one and prints its kubeconfig path.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import yaml

from e2e import servers
from e2e.certs import Pki, write_kubeconfig
from e2e.netns import Namespace
from e2e.node import (
    CLUSTER_DOMAIN,
    NODE_IP,
    NODE_LEASE_SECONDS,
    Node,
    NodeCredentials,
    NodeSpec,
    join,
    route_pods,
    set_up_network,
)
from nopstream.local.children import Child

SERVICE_CIDR = "10.96.0.0/24"
NODE_MONITOR_GRACE = f"{NODE_LEASE_SECONDS}s"  # four of a kubelet's lease renewals
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
class Cut:
    """A partition in force: the commands that undo it, run by `heal`."""

    undo: list[tuple[Namespace, tuple[str, ...]]]

    def heal(self) -> None:
        """End the partition (once; later calls do nothing)."""
        while self.undo:
            ns, argv = self.undo.pop()
            ns.run(*argv)


@dataclass
class Cluster:
    """A running cluster and the files a client needs."""

    workdir: Path
    ns: Namespace
    pki: Pki
    kubeconfig: Path
    audit_log: Path
    server: str = ""
    nodes: list[Node] = field(default_factory=list)
    processes: list[Child] = field(default_factory=list)

    @property
    def ca(self) -> Path:
        """The cluster CA certificate."""
        return self.pki.ca.cert

    @classmethod
    def start(cls, workdir: Path, *, nodes: int = 2, timeout: float = 180.0) -> Cluster:
        """Create the namespaces, start every component, and wait until every node is Ready.

        The nodes start side by side (importing the images is most of a node's start).
        """
        workdir.mkdir(parents=True, exist_ok=True)
        ns = Namespace.create(workdir / "ns")
        cluster = cls(workdir, ns, Pki(workdir / "pki"), workdir / "admin.kubeconfig", workdir / "audit.log")
        specs = [NodeSpec(i) for i in range(nodes)]
        try:
            set_up_network(ns)
            route_pods(ns, specs[0], specs)
            cluster._start_control_plane(timeout)
            creds = [cluster._node_credentials(spec) for spec in specs]
            with ThreadPoolExecutor(nodes) as pool:
                starts = [
                    pool.submit(cluster._start_node, spec, specs, c)
                    for spec, c in zip(specs, creds, strict=True)
                ]
            failed = [exc for f in starts if (exc := f.exception()) is not None]
            cluster.nodes.extend(f.result() for f in starts if f.exception() is None)
            if failed:
                raise failed[0]
            servers.wait_until("every node Ready", cluster._nodes_ready, timeout=timeout)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start_node(self, spec: NodeSpec, specs: list[NodeSpec], creds: NodeCredentials) -> Node:
        """Start node `spec`, past node-0 in a namespace of its own linked to the bridge."""
        if not spec.index:
            return Node.start(spec, self.ns, self.workdir / spec.name, creds, own_ns=False)
        ns = Namespace.create(self.workdir / f"ns-{spec.name}")
        try:
            join(self.ns, ns, spec)
            route_pods(ns, spec, specs)
            return Node.start(spec, ns, self.workdir / spec.name, creds, own_ns=True)
        except BaseException:
            ns.stop()
            raise

    def _inside_kubeconfig(self, name: str, cn: str, orgs: tuple[str, ...] = ()) -> Path:
        client = self.pki.issue(name, cn, orgs=orgs)
        return write_kubeconfig(
            self.workdir / f"{name}.kubeconfig",
            server=f"https://{NODE_IP}:{APISERVER_PORT}",
            ca=self.ca,
            user=name,
            client=client,
        )

    def _node_credentials(self, spec: NodeSpec) -> NodeCredentials:
        return NodeCredentials(
            ca=self.ca,
            kubelet=self._inside_kubeconfig(
                f"kubelet-{spec.name}", f"system:node:{spec.name}", ("system:nodes",)
            ),
            kube_proxy=self._inside_kubeconfig("kube-proxy", "system:kube-proxy"),
            # the NetworkPolicy enforcer is test infrastructure too, as CoreDNS is
            kube_router=self._inside_kubeconfig("kube-router", "kube-router", ("system:masters",)),
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
                    f"--node-monitor-grace-period={NODE_MONITOR_GRACE}",
                    "--node-monitor-period=1s",
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
        for proc in [*self.processes, *(p for node in self.nodes for p in node.processes)]:
            if not proc.alive():
                raise servers.ServerError(f"{proc.name} exited\n{proc.tail(30)}")

    def _components_up(self) -> bool:
        self._alive()
        # The scheduler and the controller manager are up once they have read the API
        # server: the default service account of `default` is made by a controller.
        return self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0

    def _nodes_ready(self) -> bool:
        self._alive()
        return all(self.node_ready(node.spec.name) for node in self.nodes)

    def node_ready(self, name: str) -> bool:
        """Whether Node `name`'s Ready condition is True."""
        out = self.kubectl(
            "get", "node", name, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
            check=False,
        )  # fmt: skip
        return out.stdout.strip() == "True"

    def node(self, name: str) -> Node:
        """The running node called `name`."""
        return next(n for n in self.nodes if n.spec.name == name)

    def container_pid(self, container_id: str) -> int:
        """The host PID of a container's first process, on whichever node runs it."""
        for node in self.nodes:
            with contextlib.suppress(LookupError):
                return node.container_pid(container_id)
        raise LookupError(f"no node runs {container_id}")

    def cut(self, one: Iterable[str], other: Iterable[str]) -> Cut:
        """Drop every packet between addresses `one` and `other` (pods', nodes') both ways, from
        now until `Cut.heal`: rules first in FORWARD on every node, where all of a pod's traffic
        passes (bridged too: bridge-nf-call-iptables); established connections included."""
        rules = [
            (node.ns, ("FORWARD", "-s", a, "-d", b, "-j", "DROP"))
            for node in self.nodes
            for x, y in itertools.product(one, other)
            for a, b in ((x, y), (y, x))
        ]
        for ns, rule in rules:
            ns.run("iptables", "-w", "-I", *rule[:1], "1", *rule[1:])
        return Cut([(ns, ("iptables", "-w", "-D", *rule)) for ns, rule in rules])

    def isolate_node(self, name: str) -> Cut:
        """Cut worker node `name` off the nodes' bridge (its link down): its processes run on, it
        reaches nothing and nothing reaches it (the control plane, etcd, node-0's pods) until healed."""
        link = f"n{self.node(name).spec.index}"
        self.ns.run("ip", "link", "set", link, "down")
        return Cut([(self.ns, ("ip", "link", "set", link, "up"))])

    def kill_node(self, name: str) -> None:
        """Lose worker node `name` (`Node.kill`); it stays listed, dead, until `restart_node`."""
        self.node(name).kill()

    def restart_node(self, name: str, *, timeout: float = 120.0) -> None:
        """Start lost node `name` again in a new namespace, as a machine boots: same name, address
        and disk (its images), no container left; wait until it is Ready."""
        old = self.node(name)
        old.stop()  # what the lost node left: its cgroups
        # the kernel removes a dead namespace's links a moment after its last process
        link = f"n{old.spec.index}"
        servers.wait_until(
            f"{link} gone", lambda: self.ns.run("ip", "link", "show", link, check=False).returncode
        )
        specs = [n.spec for n in self.nodes]
        self.nodes[self.nodes.index(old)] = new = self._start_node(
            old.spec, specs, self._node_credentials(old.spec)
        )
        servers.wait_until(
            f"{name} Ready", lambda: new.ns.holder.alive() and self.node_ready(name), timeout=timeout
        )

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
        """Stop the nodes (containers, cgroups, their namespaces), every component by PID, then the
        suite's namespace."""
        try:
            for node in reversed(self.nodes):
                node.stop()
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
    parser.add_argument("--nodes", type=int, default=2)
    args = parser.parse_args()
    with Cluster.start(args.workdir, nodes=args.nodes) as cluster:
        print(f"KUBECONFIG={cluster.kubeconfig}", flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
    sys.exit(0)


if __name__ == "__main__":
    main()
