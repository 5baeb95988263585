"""Which network interface gloo (and nccl) bind to: the one that routes to ``MASTER_ADDR``.

gloo otherwise binds to the address the hostname resolves to, often a loopback address;
:func:`choose_interface` (called by :func:`sarcompile.dist.process_group.init` on more
than one worker) sets ``GLOO_SOCKET_IFNAME`` where the user has not. Standard library only.
"""

from __future__ import annotations

import fcntl
import ipaddress
import logging
import os
import socket
import struct

__all__ = ["choose_interface", "route_interface"]

_SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's (first) IPv4 address

log = logging.getLogger(__name__)


def choose_interface(backend: str = "gloo") -> str | None:
    """Bind gloo (and nccl) to the network interface that routes to ``MASTER_ADDR``.

    gloo otherwise binds to the address the machine's *hostname* resolves to, which is
    often a loopback address (``127.0.1.1 myhost`` in /etc/hosts, containers, network
    namespaces): the workers on one machine then reach each other but never the other
    machines ("connectFullMesh failed", or a connect timeout). When ``GLOO_SOCKET_IFNAME``
    (``NCCL_SOCKET_IFNAME`` for nccl) is unset and ``MASTER_ADDR`` is not a loopback
    address, this sets it to the interface holding the local address the kernel would
    send from to reach ``MASTER_ADDR``. Values the user set are kept. Returns the
    interface chosen (None when nothing was set); logs the choice at INFO level
    (``logging.getLogger("sarcompile.dist.interface")``).
    """
    names = ["GLOO_SOCKET_IFNAME"] + (["NCCL_SOCKET_IFNAME"] if backend == "nccl" else [])
    unset = [n for n in names if not os.environ.get(n)]
    master = os.environ.get("MASTER_ADDR", "")
    if not unset or not master:
        return None
    found = route_interface(master, int(os.environ.get("MASTER_PORT") or 29500))
    if found is None:
        return None
    ifname, local = found
    for n in unset:
        os.environ[n] = ifname
    log.info("%s=%s: the interface of %s, the local address that routes to MASTER_ADDR=%s",
             "/".join(unset), ifname, local, master)
    return ifname


def route_interface(host: str, port: int = 29500) -> tuple[str, str] | None:
    """(interface name, local address) this machine would use to reach ``host``, or None
    when ``host`` is a loopback address, does not resolve, has no route, or the address is
    on the loopback interface (``host`` is this machine itself, without a network)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError) as e:
        log.info("MASTER_ADDR=%s does not resolve here (%s): not choosing a network interface", host, e)
        return None
    if not infos or any(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos):
        if int(os.environ.get("LOCAL_WORLD_SIZE") or 0) not in (0, int(os.environ.get("WORLD_SIZE") or 0)):
            log.warning(
                "MASTER_ADDR=%s is a loopback address here, but the job spans several machines "
                "(WORLD_SIZE=%s, LOCAL_WORLD_SIZE=%s): workers on other machines cannot reach it. Give "
                "torchrun an address the other machines reach (--master-addr; with --rdzv-backend c10d, "
                "--local-addr), or make this machine's hostname resolve to one (see "
                "docs/several-machines.md).", host, os.environ.get("WORLD_SIZE"), os.environ.get("LOCAL_WORLD_SIZE"))
        return None
    family, _, _, _, sockaddr = infos[0]
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)  # UDP: picks the route and source address, sends nothing
            local = s.getsockname()[0].split("%")[0]
    except OSError as e:
        log.info("no route to MASTER_ADDR=%s (%s): not choosing a network interface", host, e)
        return None
    ifname = _interface_with_address(local)
    if ifname is None or ipaddress.ip_address(local).is_loopback or _is_loopback_interface(ifname):
        log.info("local address %s (towards MASTER_ADDR=%s) is on no non-loopback interface", local, host)
        return None
    return ifname, local


def _is_loopback_interface(ifname: str) -> bool:
    try:
        with open(f"/sys/class/net/{ifname}/flags") as f:
            return bool(int(f.read(), 16) & 0x8)  # IFF_LOOPBACK
    except (OSError, ValueError):
        return ifname == "lo"


def _interface_with_address(local: str) -> str | None:
    """The name of the interface holding address ``local`` (stdlib only: ioctl for IPv4,
    /proc/net/if_inet6 for IPv6)."""
    addr = ipaddress.ip_address(local)
    if addr.version == 4:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for _, name in socket.if_nameindex():
                try:
                    got = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
                except OSError:  # no IPv4 address on this interface
                    continue
                if socket.inet_ntoa(got[20:24]) == local:
                    return name
        return None
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 6 and ipaddress.ip_address(int(fields[0], 16)) == addr:
                    return fields[5]
    except OSError:
        pass
    return None
