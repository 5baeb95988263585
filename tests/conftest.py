import pytest

from workers import WorkerPool


@pytest.fixture(scope="session")
def pool():
    """``pool(n)``: a live group of n gloo workers, started once per session and reused."""
    pools: dict[int, WorkerPool] = {}

    def get(n: int) -> WorkerPool:
        if n not in pools or pools[n].closed:
            pools[n] = WorkerPool(n)
        return pools[n]

    yield get
    for p in pools.values():
        p.close()
