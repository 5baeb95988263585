"""dist/interface.py: which network interface gloo binds to."""

from __future__ import annotations

import os

from sarcompile.dist.interface import choose_interface, route_interface


def test_choose_interface_leaves_loopback_and_user_choices_alone(monkeypatch):
    """The routed choice itself is what the two-host runs of tests/runtime/test_multihost.py prove."""
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    for addr in ("127.0.0.1", "localhost", "::1"):
        monkeypatch.setenv("MASTER_ADDR", addr)
        assert route_interface(addr) is None and choose_interface() is None
        assert "GLOO_SOCKET_IFNAME" not in os.environ
    monkeypatch.setenv("MASTER_ADDR", "10.77.0.1")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "mine")
    assert choose_interface() is None and os.environ["GLOO_SOCKET_IFNAME"] == "mine"
    monkeypatch.setenv("MASTER_ADDR", "no-such-host.invalid")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    assert choose_interface() is None and "GLOO_SOCKET_IFNAME" not in os.environ
