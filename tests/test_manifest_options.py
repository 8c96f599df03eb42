"""The manifest options reach the source kind: from ``LMDBDataModule(manifest=...)``, the Hydra ``data.manifest`` node and the
``build`` / ``verify`` flags, through ``scan``, ``has_samples`` and ``classes``; in the hyper-parameters as plain values.

The ``list`` source kind of ``seamkit`` (the ``list_kind`` fixture), registered first, records the options each call receives.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from PIL import Image

from lightning_lmdb import LMDBDataModule
from lightning_lmdb.errors import OptionError
from lightning_lmdb.sources.base import ManifestOptions
from lightning_lmdb.tools.cli import build_options, main, make_parser

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

GIVEN = {"label_column": "tags", "label_sep": "|", "classes": ["a", "b"]}
EXPECTED = ManifestOptions(label_column="tags", label_sep="|", classes=("a", "b"))


@pytest.fixture
def listing(tmp_path: Path) -> Path:
    images = tmp_path / "images"
    images.mkdir()
    for i in range(4):
        Image.new("RGB", (6, 5), (50 * i, 0, 0)).save(images / f"{i}.png")
    path = images / "train.list"
    path.write_text("0.png 0\n1.png 1\n2.png 0\n3.png 1\n")
    return path


def _plain(value: object) -> bool:
    if type(value) is dict:
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if type(value) in (tuple, list):
        return all(_plain(item) for item in value)
    return value is None or type(value) in (str, int, float, bool)


@pytest.mark.parametrize("backend", ["lmdb", "raw"])
def test_the_datamodules_manifest_options_reach_every_call_of_the_kind(list_kind, listing: Path, tmp_path: Path, backend: str) -> None:
    dm = LMDBDataModule(listing, manifest=GIVEN, backend=backend, val_fraction=0, cache_dir=tmp_path / "cache", num_workers=0,
                        build_workers=0)
    assert dm.build_options.manifest == EXPECTED
    assert dm.num_classes == 2
    dm.prepare_data()
    dm.setup("fit")
    assert len(dm.datasets["train"]) == 4
    called = {name for name, _ in list_kind.CALLS}
    assert called == {"has_samples", "classes", "scan"}, list_kind.CALLS
    assert all(options == EXPECTED for _, options in list_kind.CALLS), list_kind.CALLS


def test_the_hyper_parameters_hold_the_options_set_as_plain_values(list_kind, listing: Path, tmp_path: Path) -> None:
    dm = LMDBDataModule(listing, manifest=ManifestOptions(label_column=("x", "y"), target_kind="regression"), cache_dir=tmp_path / "c")
    assert dm.hparams["manifest"] == {"label_column": ["x", "y"], "target_kind": "regression"} and _plain(dict(dm.hparams))
    buffer = io.BytesIO()
    torch.save(dict(dm.hparams), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert LMDBDataModule(**loaded).build_options.manifest == dm.build_options.manifest, "the hyper-parameters rebuild the module"
    assert LMDBDataModule(listing, cache_dir=tmp_path / "c").hparams["manifest"] is None, "none set: None, as the signature's default"


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ({"label_colum": "tags"}, r"'label_colum' unknown.*label_column.*Hydra: data\.manifest\."),
        ({"target_kind": "ordinal"}, r"target_kind='ordinal' is not one of .*'multilabel'.*Hydra: data\.manifest\."),
        ("tags", r"manifest='tags' must be a mapping of manifest options.*data\.manifest\.label_column=tags"),
    ],
)
def test_bad_manifest_options_are_refused_naming_the_key(listing: Path, tmp_path: Path, manifest: object, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        LMDBDataModule(listing.parent, manifest=manifest, cache_dir=tmp_path / "cache")  # type: ignore[arg-type]


def test_hydras_manifest_node_reaches_the_kind(list_kind, listing: Path, tmp_path: Path) -> None:
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[f"data.train_dir={listing}", f"paths.data_dir={tmp_path}", "data.manifest.label_column=tags",
                                          "data.manifest.classes=[a,b]", "data.manifest.label_sep=|"])
    dm = instantiate(cfg.data)
    assert dm.build_options.manifest == EXPECTED and dm.hparams["manifest"] == GIVEN and _plain(dict(dm.hparams))
    assert dm.num_classes == 2
    assert list_kind.CALLS and all(options == EXPECTED for _, options in list_kind.CALLS), list_kind.CALLS


FLAGS = ["--root", "ROOT", "--path-column", "file", "--label-column", "x,y", "--split-column", "fold", "--target-kind", "regression",
         "--label-sep", ";", "--classes", "a, b"]


def test_the_build_flags_are_the_manifest_options(list_kind, listing: Path, tmp_path: Path) -> None:
    flags = [value.replace("ROOT", str(listing.parent)) for value in FLAGS]
    expected = ManifestOptions(root=str(listing.parent), path_column="file", label_column=("x", "y"), split_column="fold",
                               target_kind="regression", label_sep=";", classes=("a", "b"))
    assert build_options(make_parser().parse_args(["build", "s", "t", *flags])).manifest == expected
    assert build_options(make_parser().parse_args(["build", "s", "t", "--label-column", "tags"])).manifest == ManifestOptions(
        label_column="tags")
    assert main(["build", str(listing), str(tmp_path / "out.lmdb"), "--workers", "0", "--quiet", *flags]) == 0
    assert [name for name, _ in list_kind.CALLS] == ["scan"] and list_kind.CALLS[0][1] == expected
    with pytest.raises(SystemExit) as exited:
        make_parser().parse_args(["build", "s", "t", "--target-kind", "ordinal"])
    assert exited.value.code == 2


def test_the_verify_flags_read_the_source(list_kind, listing: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "out.lmdb"
    assert main(["build", str(listing), str(target), "--workers", "0", "--quiet", "--label-sep", "|"]) == 0
    list_kind.CALLS.clear()
    assert main(["verify", str(target), "--source", str(listing), "--label-sep", "|", "--classes", "a,b"]) == 0
    assert list_kind.CALLS == [("scan", ManifestOptions(label_sep="|", classes=("a", "b")))]
    capsys.readouterr()
    assert main(["verify", str(target), "--label-column", "tags"]) == 2, "the flags read a source: without one they are refused"
    assert "--label-column say how to read the source, and no --source was given" in capsys.readouterr().err


def test_the_target_kind_is_known_before_setup(tmp_path: Path) -> None:
    """What train.py sizes its model by: a regression manifest's kind and value names, a folder's, a database's."""
    images = tmp_path / "images"
    images.mkdir()
    rows = ["path,x,y"]
    for i in range(4):
        Image.new("RGB", (6, 5), (50 * i, 0, 0)).save(images / f"{i}.png")
        rows.append(f"{i}.png,{i + 0.5},{i * 0.25 + 0.125}")
    (images / "train.csv").write_text("\n".join(rows) + "\n")
    dm = LMDBDataModule(images / "train.csv", manifest={"label_column": "x,y"}, val_fraction=0, cache_dir=tmp_path / "cache",
                        num_workers=0, build_workers=0)
    assert (dm.target_kind, dm.target_names, dm.num_classes) == ("regression", ["x", "y"], 0)
    dm.prepare_data()
    dm.setup("fit")
    assert (dm.target_kind, dm.target_names) == ("regression", ["x", "y"]), "the same from the dataset"
    flat, classed = tmp_path / "flat", tmp_path / "classed" / "cat"
    for folder in (flat, classed):
        folder.mkdir(parents=True)
        Image.new("RGB", (6, 5)).save(folder / "0.png")
    assert LMDBDataModule(flat, cache_dir=tmp_path / "cache").target_kind == "none"
    assert LMDBDataModule(classed.parent, cache_dir=tmp_path / "cache").target_kind == "class"
    given = LMDBDataModule(dm.database_path("train"), cache_dir=tmp_path / "cache")
    assert (given.target_kind, given.target_names) == ("regression", ["x", "y"]), "a given database's"
