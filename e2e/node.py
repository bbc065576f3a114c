"""A node of the test cluster: containerd, the kubelet, kube-proxy, kube-router's NetworkPolicy
firewall (and, on the first, CoreDNS).

The first node, node-0, runs in the suite's own namespace (`e2e/netns.py`) beside the
control plane; every other node runs in a network and mount namespace of its own,
joined to the first by a veth pair whose outer end is a port of the bridge `nodes` in
the suite's namespace (`join`). Nodes reach each other's pods by routes through that
bridge; nothing of them is on this machine's interfaces. Each node's pods get
addresses on a bridge of the node's own (the CNI bridge plugin) in its own subnet,
Service IPs are iptables rules there (kube-proxy), NetworkPolicies are iptables rules and
ipsets there (kube-router, its firewall alone: the bridge plugin keeps routing pods), and
names resolve through CoreDNS
listening on node-0's address (every kubelet's clusterDNS). Pods are containers of
images built by `scripts/build-image.sh` and imported into each node's containerd at
its first start: no registry is reached. The kubelet puts every pod's cgroups under a
cgroup root of this node's own, removed (with every process in it killed) at stop.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from e2e import servers
from e2e.netns import Namespace, kill_until_gone
from nopstream.local.children import Child

NODE_NAME = "node-0"
NODE_IP = "10.250.0.2"  # node-0's: the control plane's too
NODES = ipaddress.IPv4Network("10.250.0.0/24")  # the nodes' addresses on their bridge
POD_CIDR = "10.88.0.0/16"  # the cluster's: node i's pods are in 10.88.i.0/24
BRIDGE = "nodes"  # in the suite's namespace: node-0's address, the other nodes' links
CLUSTER_DOMAIN = "cluster.local"
PAUSE_IMAGE = "docker.io/nopstream-e2e/pause:0.1.0"
# the runtime image with the e2e jobs' functions: what the suite's pods run
E2E_IMAGE = "docker.io/nopstream/runtime-e2e:0.1.0"
# the archives of scripts/build-image.sh the node imports (runtime-e2e holds runtime's layers)
IMAGES = ("pause", "etcd", "minio", "runtime-e2e")
IMAGES_DIR = servers.CACHE / "images"  # where scripts/build-image.sh leaves them
CNI_PLUGINS = "/usr/lib/cni"  # Debian's containernetworking-plugins
RUNC = "/usr/sbin/runc"  # Debian's runc
CGROUP_FS = Path("/sys/fs/cgroup")
NODE_LEASE_SECONDS = 12


@dataclass(frozen=True)
class NodeSpec:
    """A node's place in the cluster: its name, address and pods' subnet follow its index."""

    index: int

    @property
    def name(self) -> str:
        """`node-<index>`: the Node object's name and the kubelet's hostname."""
        return f"node-{self.index}"

    @property
    def ip(self) -> str:
        """The node's address on the nodes' bridge."""
        return f"10.250.0.{2 + self.index}"

    @property
    def pod_subnet(self) -> str:
        """The addresses of the node's pods."""
        return f"10.88.{self.index}.0/24"


@dataclass(frozen=True)
class NodeCredentials:
    """What the node's components authenticate with: kubeconfigs and the cluster CA."""

    ca: Path
    kubelet: Path
    kube_proxy: Path
    kube_router: Path
    coredns: Path


def _cgroup_controllers() -> list[Path]:
    """The mounted cgroup hierarchies (v1 controllers, the named systemd one, and v2)."""
    return sorted(p for p in CGROUP_FS.iterdir() if p.is_dir() and not p.is_symlink())


def set_up_network(ns: Namespace) -> None:
    """Give the suite's namespace node-0's address on the nodes' bridge and let it route pods' traffic."""
    ns.run("ip", "link", "add", BRIDGE, "type", "bridge")
    ns.run("ip", "addr", "add", f"{NODE_IP}/{NODES.prefixlen}", "dev", BRIDGE)
    ns.run("ip", "link", "set", BRIDGE, "up")
    # A default route so that Service IPs (DNAT in OUTPUT) and the kubelet's node-IP
    # checks find one; nothing leaves the namespace through it.
    ns.run("ip", "route", "add", "default", "dev", BRIDGE)
    _forwarding(ns)


def _forwarding(ns: Namespace) -> None:
    for key in ("net.ipv4.ip_forward=1", "net.bridge.bridge-nf-call-iptables=1"):
        ns.run("sysctl", "-q", "-w", key)


def join(cluster: Namespace, ns: Namespace, spec: NodeSpec) -> None:
    """Link node `spec`'s own namespace `ns` to the nodes' bridge in `cluster` (after `set_up_network`)."""
    outer = f"n{spec.index}"  # the port on the bridge; the inner end is the node's eth0
    cluster.run(
        "ip", "link", "add", outer, "type", "veth", "peer", "name", "eth0", "netns", str(ns.holder.pid)
    )
    cluster.run("ip", "link", "set", outer, "master", BRIDGE, "up")
    ns.run("ip", "addr", "add", f"{spec.ip}/{NODES.prefixlen}", "dev", "eth0")
    ns.run("ip", "link", "set", "eth0", "up")
    ns.run("ip", "route", "add", "default", "via", NODE_IP)
    _forwarding(ns)


def route_pods(ns: Namespace, own: NodeSpec, nodes: list[NodeSpec]) -> None:
    """Routes from node `own`'s namespace to every other node's pods, through that node."""
    for other in nodes:
        if other != own:
            ns.run("ip", "route", "replace", other.pod_subnet, "via", other.ip)


@dataclass
class Node:
    """A running node; `stop` removes its containers, processes and cgroups (and its own namespace)."""

    spec: NodeSpec
    ns: Namespace
    workdir: Path
    cgroup_root: str
    processes: list[Child] = field(default_factory=list)
    own_ns: bool = False  # a namespace of its own (every node but node-0), stopped with it

    # containerd's API socket and state: in the namespace's own /run (a socket path under a
    # test's temporary directory is too long for a unix socket)
    containerd_socket = Path("/run/containerd/containerd.sock")

    @classmethod
    def start(
        cls,
        spec: NodeSpec,
        ns: Namespace,
        workdir: Path,
        creds: NodeCredentials,
        *,
        own_ns: bool,
        timeout: float = 120.0,
    ) -> Node:
        """Make the node's cgroup root, start its components, import the images it lacks.

        Its namespace is linked already (`set_up_network` or `join`); node-0 runs CoreDNS.
        A node started again over the same `workdir` (`Cluster.restart_node`) finds its
        images in containerd's root there, as a rebooted machine finds its disk.
        """
        workdir.mkdir(parents=True, exist_ok=True)
        node = cls(spec, ns, workdir, f"/nopstream-e2e-{os.getpid()}-{secrets.token_hex(3)}", own_ns=own_ns)
        try:
            node._make_cgroup_root()
            node._containerd(timeout)
            node._import_images()
            node._kubelet(creds)
            node._kube_proxy(creds)
            node._kube_router(creds)
            if spec.index == 0:
                node._coredns(creds)
        except BaseException:
            node.stop()
            raise
        return node

    def _roots(self) -> list[tuple[Path, Path]]:
        """(hierarchy, the node's cgroup root in it) for every mounted cgroup hierarchy."""
        return [(c, c / self.cgroup_root.lstrip("/")) for c in _cgroup_controllers()]

    def _make_cgroup_root(self) -> None:
        for controller, path in self._roots():
            path.mkdir(exist_ok=True)
            if controller.name == "cpuset":  # a v1 cpuset starts empty: give it its parent's
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (path / f).write_text((controller / f).read_text())

    def _containerd(self, timeout: float) -> None:
        d = self.workdir / "containerd"
        cni = self.workdir / "cni"
        (cni / "net.d").mkdir(parents=True, exist_ok=True)
        (cni / "net.d" / "10-bridge.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "e2e",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": "cni0",
                            "isGateway": True,
                            # pods reach other nodes' pods by their own addresses (routes, no NAT)
                            "ipMasq": False,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": self.spec.pod_subnet}]],
                                "routes": [{"dst": "0.0.0.0/0"}],
                                # its leases in the node's own /var/lib: a restarted node starts empty
                            },
                        },
                        {"type": "portmap", "capabilities": {"portMappings": True}},
                    ],
                }
            )
        )
        config = f"""version = 3
root = "{d / "root"}"
state = "/run/containerd"
[grpc]
  address = "{self.containerd_socket}"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"
[plugins."io.containerd.cri.v1.runtime"]
  # root here lacks CAP_SYS_RESOURCE: lowering a container's oom_score_adj fails
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
      BinaryName = "{RUNC}"
      SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{CNI_PLUGINS}"]
    conf_dir = "{cni / "net.d"}"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "{self.spec.ip}"
"""
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.toml").write_text(config)
        binaries = Path(servers.binary("containerd")).parent
        proc = self.ns.spawn(
            "containerd",
            [servers.binary("containerd"), "--config", str(d / "config.toml")],
            log=self.workdir / "containerd.log",
            env={"PATH": f"{binaries}:{os.environ.get('PATH', '')}"},  # it finds its shim on PATH
        )
        self.processes.append(proc)
        servers.wait_until(
            "containerd",
            lambda: self.ctr("version", check=False).returncode == 0,
            process=proc,
            timeout=timeout,
        )

    def ctr(self, *args: str, check: bool = True, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """Run `ctr` against this node's containerd, in the k8s.io namespace."""
        return self.ns.run(
            servers.binary("ctr"), f"--address={self.containerd_socket}", "-n", "k8s.io", *args,
            check=check, timeout=timeout,
        )  # fmt: skip

    def _import_images(self) -> None:
        done = self.workdir / "containerd" / "imported"  # beside containerd's root: kept over restarts
        if done.exists():
            return
        for name in IMAGES:
            archive = IMAGES_DIR / f"{name}.tar"
            if not archive.exists():
                raise servers.ServerError(f"no image {archive}: run scripts/install-servers.sh image")
            self.ctr("images", "import", str(archive))
        done.touch()

    def _kubelet(self, creds: NodeCredentials) -> None:
        # Its root dir (volumes, pod resources socket) and the pods' logs stay at their
        # defaults, /var/lib/kubelet and /var/log/pods: inside, both are the namespace's tmpfs.
        d = self.workdir / "kubelet"
        d.mkdir(parents=True, exist_ok=True)
        # the pods' resolv.conf: only the cluster's names resolve (nothing upstream is reachable)
        (d / "resolv.conf").write_text(f"nameserver {NODE_IP}\n")
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.spec.ip,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(creds.ca)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root,
            "failCgroupV1": False,  # this machine mounts cgroup v1 (hybrid)
            "failSwapOn": False,
            "clusterDNS": [NODE_IP],
            "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": str(d / "resolv.conf"),
            # a test machine's disk and memory are the machine's business, not the node's
            "evictionHard": {"memory.available": "0%", "nodefs.available": "0%", "imagefs.available": "0%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "registerNode": True,
            "maxPods": 110,
            "shutdownGracePeriod": "0s",
            # renewed every quarter of it: the controller manager's grace (`e2e/cluster.py`) sees
            # four renewals missed before it calls the node lost
            "nodeLeaseDurationSeconds": NODE_LEASE_SECONDS,
        }
        (d / "config.yaml").write_text(yaml.safe_dump(config))
        self.processes.append(
            self.ns.spawn(
                "kubelet",
                [
                    servers.binary("kubelet"),
                    f"--config={d / 'config.yaml'}",
                    f"--kubeconfig={creds.kubelet}",
                    f"--node-ip={self.spec.ip}",
                    f"--hostname-override={self.spec.name}",
                    "--v=1",
                ],
                log=self.workdir / "kubelet.log",
            )
        )

    def _kube_proxy(self, creds: NodeCredentials) -> None:
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clientConnection": {"kubeconfig": str(creds.kube_proxy)},
            "hostnameOverride": self.spec.name,
            "bindAddress": self.spec.ip,
            "clusterCIDR": POD_CIDR,
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            # conntrack limits are kernel-wide: leave them as they are
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
        }
        path = self.workdir / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump(config))
        self.processes.append(
            self.ns.spawn(
                "kube-proxy",
                [servers.binary("kube-proxy"), f"--config={path}", "--v=1"],
                log=self.workdir / "kube-proxy.log",
            )
        )

    def _kube_router(self, creds: NodeCredentials, timeout: float = 60.0) -> None:
        """kube-router's NetworkPolicy firewall only: pod routes, the CNI and Services stay ours.

        It starts once the kubelet registered the Node: kube-router exits when it finds none.
        """
        kubectl = (servers.binary("kubectl"), f"--kubeconfig={creds.kube_router}")
        servers.wait_until(
            f"{self.spec.name} registered",
            lambda: not self.ns.run(*kubectl, "get", "node", self.spec.name, check=False).returncode,
            timeout=timeout,
        )
        self.processes.append(
            self.ns.spawn(
                "kube-router",
                [
                    servers.binary("kube-router"),
                    f"--kubeconfig={creds.kube_router}",
                    f"--hostname-override={self.spec.name}",
                    "--run-firewall=true",
                    "--run-router=false",
                    "--run-service-proxy=false",
                    "--enable-cni=false",
                    "--health-port=0",
                    "--metrics-port=0",
                    "--v=1",
                ],
                log=self.workdir / "kube-router.log",
            )
        )

    def _coredns(self, creds: NodeCredentials) -> None:
        corefile = self.workdir / "Corefile"
        corefile.write_text(
            f""".:53 {{
    bind {NODE_IP}
    errors
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {creds.coredns} test
        pods insecure
    }}
    ready 127.0.0.1:8181
}}
"""
        )
        self.processes.append(
            self.ns.spawn(
                "coredns",
                [servers.binary("coredns"), "-conf", str(corefile)],
                log=self.workdir / "coredns.log",
            )
        )

    def container_pid(self, container_id: str) -> int:
        """The host PID of a container's first process, from its status `containerd://ID`."""
        cid = container_id.removeprefix("containerd://")
        for line in self.ctr("tasks", "ls").stdout.splitlines()[1:]:
            task, pid, _status = line.split()
            if task == cid:
                return int(pid)
        raise LookupError(f"no running task {cid}")

    def _cgroup_tree(self) -> list[Path]:
        """Every cgroup under the node's root, in every hierarchy, children before parents."""
        found: list[Path] = []
        for _controller, root in self._roots():
            # cgroups come and go while this walks: a vanished one is simply not listed
            for top, _dirs, _files in os.walk(root, topdown=False):
                found.append(Path(top))
        return found

    def _cgroup_pids(self) -> set[int]:
        pids: set[int] = set()
        for cgroup in self._cgroup_tree():
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in (cgroup / "cgroup.procs").read_text().split())
        return pids

    def kill(self, timeout: float = 30.0) -> None:
        """Lose the node as a power cut would: every process of it (kubelet, containerd, shims,
        containers) and its namespace SIGKILLed at once; its link to the bridge goes with them.

        Only a node with a namespace of its own can be lost (node-0's is the control plane's).
        Its cgroups and files stay until `stop`; `Cluster.restart_node` starts it again.
        """
        assert self.own_ns, "node-0 shares the control plane's namespace"
        ours = [*self.processes, self.ns.holder]  # our children: polled, so reaped, not left as zombies

        def alive() -> set[int]:
            return {*self._cgroup_pids(), *self.ns.members(), *(p.pid for p in ours if p.alive())}

        left = kill_until_gone(alive, time.monotonic() + timeout)
        if left:
            raise servers.ServerError(f"processes of {self.spec.name} still alive after {timeout}s: {left}")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the kubelet, kill every container process, stop the rest, remove the cgroups."""
        for proc in self.processes:
            if proc.name == "kubelet":
                proc.stop(grace=5)  # first: it would restart what is killed next
        deadline = time.monotonic() + timeout
        kill_until_gone(self._cgroup_pids, deadline)
        for proc in reversed(self.processes):
            proc.stop(grace=5)
        self._remove_cgroups(deadline)
        if self.own_ns:
            self.ns.stop()

    def _remove_cgroups(self, deadline: float) -> None:
        for path in self._cgroup_tree():
            while True:  # a cgroup whose last process just died may be busy briefly
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
