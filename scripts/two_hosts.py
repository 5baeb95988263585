"""Run ``python -m sarcompile.train`` on two "hosts": two network namespaces joined by a
veth pair, 2 workers each, launched with torchrun's documented multi-node flags.

Needs root and ``ip netns``. Makes the namespaces, partitions a small generated graph,
starts one torchrun per host, waits (bounded), prints what each host said, and always
removes the namespaces and any process left (``--cut S`` takes the link down S seconds
after the start, to see how a lost link ends the job)::

    sudo python scripts/two_hosts.py                      # static: --master-addr/--node-rank
    sudo python scripts/two_hosts.py --rdzv               # --rdzv-backend c10d --rdzv-endpoint
    sudo python scripts/two_hosts.py --rdzv --hostnames   # ... where each host's name resolves
    sudo python scripts/two_hosts.py --rdzv --local-addr  # ... with --local-addr and is_host
    sudo python scripts/two_hosts.py --env GLOO_SOCKET_IFNAME={dev}   # the manual work-around
    sudo python scripts/two_hosts.py --epochs 400 --cut 8 --env SARCOMPILE_TIMEOUT=10

tests/runtime/test_multihost.py imports :class:`TwoHosts` and :func:`launch` from here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUBNET = "10.77.0"  # only ever configured inside the namespaces made here


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=check)


def netns_available() -> str | None:
    """None when this process can make network namespaces, else why not."""
    if os.geteuid() != 0:
        return "not root: making network namespaces needs root"
    if shutil.which("ip") is None:
        return "no 'ip' command (iproute2)"
    name = f"sc-probe-{uuid.uuid4().hex[:6]}"
    try:
        r = _ip("netns", "add", name, check=False)
        if r.returncode:
            return f"'ip netns add' failed: {r.stderr.strip()}"
    finally:
        _ip("netns", "del", name, check=False)
    return None


@dataclass
class TwoHosts:
    """Two namespaces ``ns[0]``, ``ns[1]`` with addresses ``addr[0]``, ``addr[1]`` on a veth
    pair (interfaces ``dev[0]``, ``dev[1]``). Use as a context manager: always torn down."""

    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])

    def __post_init__(self) -> None:
        self.ns = [f"sc-h1-{self.tag}", f"sc-h2-{self.tag}"]
        self.dev = [f"sc1{self.tag}", f"sc2{self.tag}"]  # interface names: at most 15 characters
        self.addr = [f"{SUBNET}.1", f"{SUBNET}.2"]
        self.names = [f"sc-host1-{self.tag}", f"sc-host2-{self.tag}"]  # only with launch(hostnames=True)

    def __enter__(self) -> TwoHosts:
        try:
            for ns in self.ns:
                _ip("netns", "add", ns)
            _ip("link", "add", self.dev[0], "netns", self.ns[0], "type", "veth", "peer", "name", self.dev[1],
                "netns", self.ns[1])
            for ns, dev, addr in zip(self.ns, self.dev, self.addr):
                _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
                _ip("-n", ns, "link", "set", dev, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def cut(self) -> None:
        """Take the link down on both ends (packets are dropped from now on)."""
        for ns, dev in zip(self.ns, self.dev):
            _ip("-n", ns, "link", "set", dev, "down", check=False)

    def pids(self) -> list[int]:
        """Processes still running inside either namespace."""
        out = []
        for ns in self.ns:
            r = _ip("netns", "pids", ns, check=False)
            out += [int(p) for p in r.stdout.split()]
        return out

    def close(self) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for ns in self.ns:
            _ip("netns", "del", ns, check=False)  # deleting a namespace deletes its veth end

    def __exit__(self, *exc) -> None:
        self.close()


def make_parts(root: Path, parts: tuple[int, ...] = (4,), nodes: int = 600) -> dict[int, Path]:
    """Partition examples/make_graph.py's generated graph into each of ``parts`` parts
    under root (``root/parts{n}``)."""
    graph = root / "graph.pt"
    py = sys.executable
    env = {**os.environ, "PYTHONPATH": _pythonpath()}
    subprocess.run([py, str(ROOT / "examples" / "make_graph.py"), "--out", str(graph), "--nodes", str(nodes),
                    "--classes", "4", "--features", "8"], check=True, env=env, timeout=120, capture_output=True)
    out = {}
    for n in parts:
        out[n] = root / f"parts{n}"
        subprocess.run([py, "-m", "sarcompile", "partition", "--edges", str(graph), "--parts", str(n),
                        "--out", str(out[n])], check=True, env=env, timeout=120, capture_output=True)
    return out


def _pythonpath() -> str:
    parts = [str(ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    return os.pathsep.join(dict.fromkeys(p for p in parts if p))


def torchrun() -> list[str]:
    """torchrun of the running interpreter's environment."""
    exe = Path(sys.executable).with_name("torchrun")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "torch.distributed.run"]


def launch_args(hosts: TwoHosts, node: int, port: int, rdzv: bool, nproc: int = 2, local_addr: bool = False) -> list[str]:
    """torchrun's own documented flags for host ``node`` of two (the master is host 0).
    ``local_addr``: the c10d work-around for hosts whose hostname resolves to loopback
    (``--local-addr`` its own address, and ``is_host`` on the endpoint host)."""
    master = hosts.addr[0]
    if rdzv:  # https://pytorch.org/docs/stable/elastic/run.html: "Fault tolerant ... / Elastic"
        args = ["--nnodes", "2", "--nproc-per-node", str(nproc), "--rdzv-id", f"sc{hosts.tag}",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{master}:{port}"]
        if local_addr:
            args += ["--local-addr", hosts.addr[node], "--rdzv-conf", f"is_host={int(node == 0)}"]
        return args
    return ["--nnodes", "2", "--node-rank", str(node), "--master-addr", master, "--master-port", str(port),
            "--nproc-per-node", str(nproc)]


def launch(hosts: TwoHosts, node: int, train_args: list[str], *, port: int = 29531, rdzv: bool = False,
           env: dict[str, str] | None = None, log: Path, hostnames: bool = False,
           local_addr: bool = False) -> subprocess.Popen:
    """Start torchrun on host ``node`` (its output to ``log``). In ``env`` values, ``{dev}``
    stands for that host's veth interface name. The caller's ``*_SOCKET_IFNAME`` are dropped.

    By default both hosts share this machine's hostname and /etc/hosts (where the hostname
    usually resolves to a loopback address). ``hostnames``: each host gets its own name
    (``hosts.names``) in its own UTS namespace, and an /etc/hosts (bind-mounted inside its
    namespace only) where both names resolve to their veth addresses, as on a cluster
    with working name resolution."""
    base = {k: v for k, v in os.environ.items() if not k.endswith("_SOCKET_IFNAME")}
    base.update({"PYTHONPATH": _pythonpath(), "OMP_NUM_THREADS": "1"})
    base.update({k: v.replace("{dev}", hosts.dev[node]) for k, v in (env or {}).items()})
    cmd = ["env", *(f"{k}={v}" for k, v in base.items()),
           *torchrun(), *launch_args(hosts, node, port, rdzv, local_addr=local_addr), "-m", "sarcompile.train",
           *train_args]
    if hostnames:
        table = log.with_name(f"hosts.{node}")
        table.write_text("127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for a, n in zip(hosts.addr, hosts.names)))
        cmd = ["unshare", "--uts", "sh", "-c", 'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"',
               str(table), hosts.names[node], *cmd]
    cmd = ["ip", "netns", "exec", hosts.ns[node], *cmd]
    with open(log, "wb") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})


def wait_all(procs: list[subprocess.Popen], limit: float) -> list[int | None]:
    """Each process's exit status, None for one still running after ``limit`` seconds."""
    deadline = time.monotonic() + limit
    out = []
    for p in procs:
        try:
            out.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            out.append(None)
    return out


def kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rdzv", action="store_true", help="c10d rendezvous instead of --master-addr/--node-rank")
    ap.add_argument("--hostnames", action="store_true",
                    help="give each host its own hostname resolving to its own address (a well-configured cluster)")
    ap.add_argument("--local-addr", action="store_true",
                    help="with --rdzv: the work-around flags --local-addr and --rdzv-conf is_host=...")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--port", type=int, default=29531)
    ap.add_argument("--limit", type=float, default=180, help="seconds to wait for both hosts")
    ap.add_argument("--cut", type=float, help="take the link down this many seconds after the start")
    ap.add_argument("--env", action="append", default=[], metavar="K=V", help="extra environment for the workers")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args()
    why = netns_available()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="sc-two-hosts-"))
    env = dict(kv.split("=", 1) for kv in a.env)
    try:
        parts = make_parts(work)[4]
        with TwoHosts() as hosts:
            train = ["--parts", str(parts), "--out", str(work / "out"), "--epochs", str(a.epochs),
                     "--hidden", "16", "--no-progress", "--checkpoint-every", "1000"]
            start = time.monotonic()
            procs = []
            try:
                for node in range(2):
                    procs.append(launch(hosts, node, train, port=a.port, rdzv=a.rdzv, env=env,
                                        log=work / f"host{node}.log", hostnames=a.hostnames,
                                        local_addr=a.local_addr))
                if a.cut is not None:
                    time.sleep(a.cut)
                    hosts.cut()
                    print(f"link cut at {time.monotonic() - start:.1f}s")
                rcs = wait_all(procs, a.limit)
            finally:
                kill_all(procs)
            took = time.monotonic() - start
            for node in range(2):
                print(f"===== host {node} ({hosts.ns[node]}, {hosts.addr[node]}): rc={rcs[node]}")
                print((work / f"host{node}.log").read_text(errors="replace")[-4000:])
            print(f"both hosts done in {took:.1f}s; left in the namespaces: {hosts.pids()}")
        return 0 if rcs == [0, 0] else 1
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work directory: {work}")


if __name__ == "__main__":
    raise SystemExit(main())
