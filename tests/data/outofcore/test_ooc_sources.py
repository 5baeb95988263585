"""sarcompile.data.outofcore.sources: .npy files read a chunk at a time, as np.load reads them whole."""

from __future__ import annotations

import numpy as np
import pytest

from sarcompile.errors import GraphError
from sarcompile.data.outofcore import DiskArray, open_edges


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.bool_])
@pytest.mark.parametrize("shape", [(0,), (7,), (10, 3), (5, 2, 2)])
def test_chunks_reassemble_the_array(tmp_path, dtype, shape):
    a = (np.arange(int(np.prod(shape))) % 5).astype(dtype).reshape(shape)
    np.save(tmp_path / "a.npy", a)
    f = DiskArray.npy(tmp_path / "a.npy")
    assert (f.shape, f.dtype) == (a.shape, a.dtype)
    for rows in (1, 3, 100):
        chunks = list(f.chunks(rows))
        assert [s for s, _ in chunks] == list(range(0, shape[0], rows))
        got = np.concatenate([c for _, c in chunks]) if chunks else np.empty((0, *shape[1:]), dtype)
        np.testing.assert_array_equal(got, a)
    np.testing.assert_array_equal(f.read(2, 4), a[2:4])


def test_edges_come_in_order_as_int64(tmp_path):
    src, dst = np.array([0, 3, 2, 1, 1], np.int32), np.array([1, 1, 0, 3, 2], np.int32)
    np.save(tmp_path / "s.npy", src), np.save(tmp_path / "d.npy", dst)
    chunks = list(open_edges(tmp_path / "s.npy", tmp_path / "d.npy", 4).chunks(2))
    assert [c[0] for c in chunks] == [0, 2, 4]
    assert all(c[1].dtype == np.int64 for c in chunks)
    np.testing.assert_array_equal(np.concatenate([c[1] for c in chunks]), src)
    np.testing.assert_array_equal(np.concatenate([c[2] for c in chunks]), dst)


def _save(path, a, fortran=False):
    np.save(path, np.asfortranarray(a) if fortran else a)
    return path


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: d / "missing.npy", "not found"),
        (lambda d: (d / "t.npy").write_bytes(b"not numpy at all") and d / "t.npy", "is not a .npy file"),
        (lambda d: _save(d / "f.npy", np.zeros((3, 2)), fortran=True), "Fortran-ordered"),
    ],
    ids=["missing", "not-npy", "fortran"],
)
def test_bad_array_files_are_named(tmp_path, make, message):
    with pytest.raises(GraphError, match=message):
        DiskArray.npy(make(tmp_path))


def test_a_truncated_file_is_refused_before_reading(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(100))
    data = (tmp_path / "a.npy").read_bytes()
    (tmp_path / "a.npy").write_bytes(data[:-8])
    with pytest.raises(GraphError, match="truncated"):
        DiskArray.npy(tmp_path / "a.npy")


@pytest.mark.parametrize(
    "src, dst, num_nodes, message",
    [
        (np.zeros((2, 2), np.int64), np.zeros(2, np.int64), 4, "one-dimensional integer"),
        (np.zeros(2, np.float32), np.zeros(2, np.int64), 4, "one-dimensional integer"),
        (np.zeros(3, np.int64), np.zeros(2, np.int64), 4, "must pair up"),
        (np.zeros(2, np.int64), np.zeros(2, np.int64), -1, "num_nodes must be an integer >= 0"),
    ],
)
def test_bad_edge_files_are_refused_when_opened(tmp_path, src, dst, num_nodes, message):
    np.save(tmp_path / "s.npy", src), np.save(tmp_path / "d.npy", dst)
    with pytest.raises(GraphError, match=message):
        open_edges(tmp_path / "s.npy", tmp_path / "d.npy", num_nodes)


def test_an_id_out_of_range_names_the_edge(tmp_path):
    np.save(tmp_path / "s.npy", np.array([0, 1, 2, 3, 9])), np.save(tmp_path / "d.npy", np.array([1, 2, 3, 0, 0]))
    edges = open_edges(tmp_path / "s.npy", tmp_path / "d.npy", 4)
    with pytest.raises(GraphError, match=r"edge 4 has src 9, outside \[0, 4\)"):
        list(edges.chunks(2))
