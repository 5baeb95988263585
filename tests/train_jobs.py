"""``sarcompile.train`` run on the ``pool`` fixture's gloo workers, for the trainer tests
(imported by the pool's workers too)."""

from __future__ import annotations

from sarcompile.errors import SarcompileError

ACC_KEYS = ("loss", "train_acc", "val_acc", "test_acc")


def train_job(rank: int, world_size: int, argv: list[str]):
    """Runs on a pool worker: the trainer's records, or the message of its error."""
    from sarcompile.train import train

    try:
        return train(argv)
    except (SarcompileError, ValueError) as e:
        return f"{type(e).__name__}: {e}"


def run_train(pool, n: int, argv: list[str]):
    """``sarcompile.train`` with ``argv`` on ``n`` workers: rank 0's records (every rank's
    curve checked equal to it), or the message of the error."""
    results = pool(n).run(train_job, [argv] * n)
    if isinstance(results[0], list):
        assert all(curve(r) == curve(results[0]) for r in results), "ranks disagree"
    return results[0]


def curve(records: list[dict]) -> list[tuple]:
    """The epochs' numbers of a run's records: epoch, loss and the metric on each mask
    (accuracies, or the task's metric: train_rocauc, train_rmse, ...)."""
    return [(r["epoch"], *(r[k] for k in metric_keys(r))) for r in records]


def metric_keys(record: dict) -> list[str]:
    """``loss`` and the record's metric per mask (ACC_KEYS for classification)."""
    return ["loss", *(k for k in record if k.split("_")[0] in ("train", "val", "test") and k != "train_s")]
