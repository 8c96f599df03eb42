"""A backend is made from a :class:`~lightning_lmdb.datamodule.plan.DataPlan` alone.

It never sees, imports or calls back into the DataModule."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest
import torch
from imagegen import make_folder
from test_masks_serve import make_pairs
from torch.utils.data import DataLoader

from lightning_lmdb.datamodule import backends
from lightning_lmdb.datamodule.module import LMDBDataModule
from lightning_lmdb.datamodule.plan import DataPlan
from lightning_lmdb.experiment.datamodule import ExperimentDataModule
from lightning_lmdb.options import BuildOptions
from lightning_lmdb.read import transforms

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_lmdb"
#: The DataModule's own modules: below them, a backend may import none (not even for typing, not inside a function).
DATAMODULE_SIDE = {"datamodule.module", "datamodule.labels", "datamodule.loaders", "experiment"}


def _imported(tree: ast.AST) -> set[str]:
    """Every ``lightning_lmdb`` module an AST imports, anywhere in it (``from lightning_lmdb import x`` counts as ``x``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {".".join(name.split(".")[1:3]) for name in names if name.startswith("lightning_lmdb.")} | {
        name.split(".")[1] for name in names if name.startswith("lightning_lmdb.")}


@pytest.mark.parametrize("module", ["datamodule/backends.py", "datamodule/plan.py"])
def test_the_backends_do_not_reference_the_datamodule(module: str) -> None:
    tree = ast.parse((PACKAGE / module).read_text(encoding="utf-8"))
    assert not _imported(tree) & DATAMODULE_SIDE, "an upward import (a cycle with datamodule/module.py)"
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    attributes = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert "LMDBDataModule" not in names and "dm" not in names | attributes, "a backend reaches into the DataModule"


def _plan(source: Path, cache: Path, backend: str, **options: object) -> DataPlan:
    return DataPlan(sources={"train": source.resolve(), "val": None, "test": None},
                    given_as={"train": str(source), "val": None, "test": None}, given_databases=frozenset(),
                    build_options=BuildOptions(workers=0, **options), cache_dir=cache, backend=backend)


@pytest.mark.parametrize("backend", ["lmdb", "raw"])
def test_a_backend_serves_a_loader_from_a_plan_alone(tmp_path: Path, backend: str) -> None:
    source = make_folder(tmp_path / "source", classes=("a", "b"), per_class=3)
    plan = _plan(source, tmp_path / "cache", backend)
    served = backends.BACKEND_CLASSES[backend](plan)  # no LMDBDataModule anywhere
    served.prepare()
    built = plan.database_path("train", served.split_options("train"))
    assert built.exists() == (backend == "lmdb"), "the LMDB backend builds in prepare, the raw backend never does"
    assert served.split_labels().classes == ["a", "b"]
    dataset = served.open("train").view(None, transforms.eval_transform(16))
    images, targets = next(iter(DataLoader(dataset, batch_size=6)))
    assert images.shape == (6, 3, 16, 16) and images.dtype == torch.uint8 and sorted(targets.tolist()) == [0, 0, 0, 1, 1, 1]
    dm = LMDBDataModule(source, backend=backend, cache_dir=tmp_path / "cache", build_workers=0, num_workers=0)
    assert dm._backend.plan is dm.plan and dm.database_path("train") == built, "the DataModule's plan names the same database"


def test_the_lmdb_backend_builds_for_the_mask_classes_itself(tmp_path: Path) -> None:
    """A mask source's classes before ``setup``: the LMDB backend builds the database (``prepare_data``'s work) without a module."""
    pairs = make_pairs(tmp_path / "pairs", count=4)
    served = backends.LMDBBackend(_plan(pairs, tmp_path / "cache", "lmdb"))
    labels = served.mask_labels("train")
    assert labels.target_kind == "mask" and labels.classes == ["0", "1", "2", "3"]
    assert served.database_path("train").exists()


def test_the_experiment_modules_hooks_reach_its_backend(tmp_path: Path) -> None:
    source = make_folder(tmp_path / "source", classes=("a", "b"), per_class=3)
    dm = ExperimentDataModule(source, cache_dir=tmp_path / "cache", local_cache_dir=tmp_path / "local", build_workers=0, num_workers=0)
    dm.prepare_data()
    assert set(dm.timings) == {"prepare_s", "stage_s"}, "the backend's steps are timed by the module's hook"
    assert (tmp_path / "local" / dm.database_path("train").name).exists()


def test_the_old_backend_class_name_warns_and_is_the_new_class() -> None:
    with pytest.warns(DeprecationWarning, match="ServingBackend"):
        old = backends.Backend
    assert old is backends.ServingBackend
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from lightning_lmdb.datamodule.backends import LMDBBackend, ServingBackend  # noqa: F401 (the new names never warn)
    with pytest.raises(AttributeError):
        backends.NoSuchName  # noqa: B018
