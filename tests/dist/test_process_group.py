"""dist/process_group.py: the timeouts read from the environment, and the bounded, counted wait."""

from __future__ import annotations

import pytest

from sarcompile.dist import process_group
from sarcompile.dist.traffic import stats
from sarcompile.errors import CommError


@pytest.mark.parametrize("value", ["abc", "0", "-5", "inf", "nan"])
def test_bad_timeout_names_the_variable(value, monkeypatch):
    monkeypatch.setenv("SARCOMPILE_TIMEOUT", value)
    with pytest.raises(ValueError, match=f"SARCOMPILE_TIMEOUT must be a number of seconds > 0 .*got '{value}'"):
        process_group.timeout()
    monkeypatch.setenv("SARCOMPILE_TIMEOUT", "2.5")
    assert process_group.timeout() == 2.5
    monkeypatch.setenv("SARCOMPILE_STALL_TIMEOUT", value)
    with pytest.raises(ValueError, match=f"SARCOMPILE_STALL_TIMEOUT must be a number of seconds > 0 .*heartbeat"):
        process_group.stall_timeout()
    monkeypatch.setenv("SARCOMPILE_STALL_TIMEOUT", "7")
    assert process_group.stall_timeout() == 7.0


class _Work:
    """A posted transfer as torch.distributed gives it: ``wait(timeout)``, which gloo fails
    with a RuntimeError when the peer is gone or late."""

    def __init__(self, error: str | None = None):
        self.error, self.limits = error, []

    def wait(self, limit):
        self.limits.append(limit.total_seconds())
        if self.error:
            raise RuntimeError(self.error)


def test_wait_bounds_each_work_and_counts_the_time_under_its_kind(monkeypatch):
    monkeypatch.setenv("SARCOMPILE_TIMEOUT", "3")
    works = [_Work(), _Work()]
    before = dict(stats.waited)
    waited = process_group.wait(works, "a test", "test-kind")
    assert [w.limits for w in works] == [[3.0], [3.0]]
    assert waited >= 0 and stats.waited["test-kind"] == before.get("test-kind", 0.0) + waited
    assert {k: v for k, v in stats.waited.items() if k != "test-kind"} == {k: v for k, v in before.items()
                                                                           if k != "test-kind"}
    del stats.waited["test-kind"]


def test_a_peer_gone_is_a_comm_error_naming_the_wait_and_the_fix(monkeypatch):
    monkeypatch.setenv("SARCOMPILE_TIMEOUT", "3")
    with pytest.raises(CommError, match=r"spmm forward: a peer worker did not answer within 3s or went away "
                                        r"\(Connection closed by peer\).*raise SARCOMPILE_TIMEOUT"):
        process_group.wait([_Work("Connection closed by peer")], "spmm forward")
