"""The user's own node ids (sarcompile.data.node_ids): checked as one distinct integer or string
per node, written as plain .npy files (chunked ids too) any numpy reads, and opened only after
the manifest's checksum, dtype and length agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import sarcompile as sc
from sarcompile.data.node_ids import check_ids, ids_file_name, kind_of, open_ids, write_node_ids


class _Chunked:
    """Integer ids on disk as the out-of-core reader gives them: a chunk at a time."""

    def __init__(self, array: np.ndarray):
        self.array, self.shape, self.dtype = array, array.shape, array.dtype

    def chunks(self, rows: int):
        for start in range(0, len(self.array), rows):
            yield start, self.array[start:start + rows]


def test_integers_become_int64_and_strings_stay_strings():
    assert check_ids(np.array([5, 3, 9], dtype=np.uint16), 3, "ids").dtype == np.int64
    assert check_ids(torch.tensor([5, 3, 9], dtype=torch.int32), 3, "ids").tolist() == [5, 3, 9]
    strings = check_ids(np.array(["ann", "bob"], dtype=object), 2, "ids")
    assert strings.dtype.kind == "U" and strings.tolist() == ["ann", "bob"]
    assert kind_of(strings.dtype) == "string" and kind_of(np.dtype(np.int64)) == "integer"


@pytest.mark.parametrize("ids, words", [
    (np.array([1, 2]), "has shape (2,) but the graph has 3 nodes"),
    (np.array([[1, 2, 3]]), "has shape (1, 3) but the graph has 3 nodes"),
    (np.array([1, 2, 1]), "repeats id 1"),
    (np.array(["a", "b", "a"]), "repeats id 'a'"),
    (np.array([1.0, 2.0, 3.0]), "has dtype float64: node ids are integers or strings"),
    (np.array([1, 2, 2**63], dtype=np.uint64), "ids above 2**63 - 1 do not fit int64; give them as strings"),
    (np.array(["a", 1, "c"], dtype=object), "has dtype object"),
])
def test_ids_that_are_not_one_distinct_id_per_node_are_refused(ids, words):
    with pytest.raises(sc.GraphError) as e:
        check_ids(ids, 3, "node_ids")
    assert str(e.value).startswith("node_ids") and words in str(e.value)


def test_chunked_ids_are_checked_by_shape_and_dtype_only():
    ids = _Chunked(np.arange(4))
    assert check_ids(ids, 4, "ids") is ids
    with pytest.raises(sc.GraphError, match=r"ids: \(4,\) float64 on disk, expected 5 integer ids"):
        check_ids(_Chunked(np.arange(4.0)), 5, "ids")


def test_file_names_are_safe_whatever_the_type_is_called():
    assert ids_file_name(None, 0) == "node_ids.npy"
    assert ids_file_name("paper", 0) == "node_ids.paper.npy"
    assert ids_file_name("field-of-study", 1) == "node_ids.field-of-study.npy"
    assert ids_file_name("../etc/x", 2) == "node_ids.type2.npy"


def test_written_files_are_plain_npy_and_open_as_written(tmp_path):
    strings = np.array(["ann", "bob", "cy"])
    record = write_node_ids(tmp_path, strings)
    assert (record["file"], record["kind"], record["dtype"], record["num_nodes"]) == (
        "node_ids.npy", "string", "<U3", 3)
    assert np.load(tmp_path / "node_ids.npy").tolist() == ["ann", "bob", "cy"]  # numpy alone reads it
    assert open_ids(tmp_path, record, sc.PartitionError, "re-run").tolist() == ["ann", "bob", "cy"]

    typed = write_node_ids(tmp_path, {"paper": np.array([7, 3], dtype=np.int64), "author": _Chunked(np.arange(5))})
    assert typed["paper"]["file"] == "node_ids.paper.npy" and typed["author"]["kind"] == "integer"
    # chunked ids are written a chunk at a time into the same format np.save writes
    assert np.load(tmp_path / "node_ids.author.npy").tolist() == list(range(5))
    assert open_ids(tmp_path, typed["paper"], sc.PartitionError, "re-run").tolist() == [7, 3]


@pytest.mark.parametrize("damage, words", [
    ("delete", "is missing: run partition again"),
    ("replace", "does not match its checksum in the manifest (damaged or replaced): run partition again"),
    ("record", "holds int64 (3,), the manifest says <i8 (4,): run partition again"),
])
def test_a_missing_or_changed_file_is_refused_with_what_to_do(tmp_path, damage, words):
    record = write_node_ids(tmp_path, np.array([4, 5, 6]))
    path = tmp_path / record["file"]
    if damage == "delete":
        path.unlink()
    elif damage == "replace":
        np.save(path, np.array([4, 5, 7]))
    else:
        record = record | {"num_nodes": 4}
    with pytest.raises(sc.PartitionError) as e:
        open_ids(tmp_path, record, sc.PartitionError, "run partition again")
    assert words in str(e.value) and str(path) in str(e.value)
