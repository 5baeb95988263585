"""A user's model by reference, ``MODULE:FACTORY`` (sarcompile.train.factory): a dotted module
or a file (whose folder becomes importable, as when the file is run), recorded with the
file's path made absolute; every wrong reference or argument is a GraphError saying what
is wrong, and arguments that do not fit the factory are refused before it is called."""

from __future__ import annotations

import json
import sys

import pytest

import sarcompile as sc
from sarcompile.train.factory import (
    build_from_factory, factory_kwargs, is_factory_spec, load_factory, recorded_spec,
)


@pytest.fixture
def models(tmp_path, monkeypatch):
    """models/gat.py importing its sibling models/_sc_factory_width.py, which records the
    factory's calls (one module, however often gat.py is loaded); sys.path and sys.modules
    as they were afterwards."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "_sc_factory_width.py").write_text("WIDTH = 7\nCALLS = []\n")
    (folder / "gat.py").write_text(
        "import _sc_factory_width as shared\n"
        "def make(hidden: int, heads: int = 1):\n"
        "    shared.CALLS.append((hidden, heads))\n"
        "    return ('model', hidden * heads, shared.WIDTH)\n"
    )
    yield folder
    sys.modules.pop("_sc_factory_width", None)


def test_a_factory_is_named_by_its_colon():
    assert is_factory_spec("models/gat.py:make") and is_factory_spec("pkg.models:make")
    assert not is_factory_spec("sage")


def test_a_file_is_recorded_by_its_absolute_path_and_a_module_as_given(models, monkeypatch):
    monkeypatch.chdir(models.parent)
    assert recorded_spec("models/gat.py:make") == f"{models / 'gat.py'}:make"
    assert recorded_spec("pkg.models:make") == "pkg.models:make"


def test_a_file_is_loaded_with_its_folder_importable(models, monkeypatch):
    monkeypatch.chdir(models.parent)
    make = load_factory("models/gat.py:make")
    assert make(hidden=4, heads=2) == ("model", 8, 7)  # 7: from the sibling module
    assert str(models.resolve()) in sys.path


def test_a_dotted_module_is_imported():
    assert load_factory("json:dumps") is json.dumps


@pytest.mark.parametrize("spec, words", [
    ("gat", "is not MODULE:FACTORY"),
    (":make", "is not MODULE:FACTORY"),
    ("json:", "is not MODULE:FACTORY"),
    ("no/such/file.py:make", "cannot import 'no/such/file.py'"),
    ("sarcompile_no_such_module:make", "cannot import 'sarcompile_no_such_module'"),
    ("json:no_such_factory", "'json' has no 'no_such_factory'"),
])
def test_a_wrong_reference_says_what_is_wrong(spec, words):
    with pytest.raises(sc.GraphError) as e:
        load_factory(spec)
    assert words in str(e.value)


def test_factory_arguments_are_a_json_object():
    assert factory_kwargs('{"hidden": 4, "heads": 2}') == {"hidden": 4, "heads": 2}
    with pytest.raises(sc.GraphError, match=r"--model-args is not JSON"):
        factory_kwargs("{hidden: 4}", flag="--model-args")
    with pytest.raises(sc.GraphError, match=r"--args must be a JSON object of keyword arguments, not '\[4\]'"):
        factory_kwargs("[4]")


def test_arguments_that_do_not_fit_are_refused_before_the_factory_runs(models):
    spec = f"{models / 'gat.py'}:make"
    assert build_from_factory(spec, {"hidden": 3}) == ("model", 3, 7)
    for kwargs in ({"hidden": 3, "width": 2}, {"heads": 2}):
        with pytest.raises(sc.GraphError) as e:
            build_from_factory(spec, kwargs, flag="--model-args")
        assert f"{spec} with keyword arguments {json.dumps(kwargs)}" in str(e.value)
        assert "give its own arguments as --model-args" in str(e.value)
    assert sys.modules["_sc_factory_width"].CALLS == [(3, 1)], "a refused call must not reach the factory"
