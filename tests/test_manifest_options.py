"""The source options reach the source kind: from ``LMDBDataModule(source_options=...)``, the Hydra ``data.source_options`` node
and the ``build`` / ``verify`` flags, through ``scan``, ``has_samples`` and ``classes``; in the hyper-parameters as plain values.
The old names (``ManifestOptions``, ``manifest=``, ``data.manifest``, an old checkpoint's ``manifest``) still work, and warn.

The ``list`` source kind of ``seamkit`` (the ``list_kind`` fixture), registered first, records the options each call receives.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from PIL import Image
from seamkit import write_listing

from lightning_lmdb import LMDBDataModule
from lightning_lmdb.errors import OptionError
from lightning_lmdb.sources.base import SourceOptions
from lightning_lmdb.tools.cli import build_options, main, make_parser

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

GIVEN = {"label_column": "tags", "label_sep": "|", "classes": ["a", "b"]}
EXPECTED = SourceOptions(label_column="tags", label_sep="|", classes=("a", "b"))


@pytest.fixture
def listing(tmp_path: Path) -> Path:
    """A ``.list`` source of four images in two classes."""
    return write_listing(tmp_path, [(0, 0), (1, 1), (2, 0), (3, 1)])


def _plain(value: object) -> bool:
    if type(value) is dict:
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if type(value) in (tuple, list):
        return all(_plain(item) for item in value)
    return value is None or type(value) in (str, int, float, bool)


@pytest.mark.parametrize("backend", ["lmdb", "raw"])
def test_the_datamodules_manifest_options_reach_every_call_of_the_kind(list_kind, listing: Path, tmp_path: Path, backend: str) -> None:
    dm = LMDBDataModule(listing, source_options=GIVEN, backend=backend, val_fraction=0, cache_dir=tmp_path / "cache", num_workers=0,
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
    options = SourceOptions(label_column=("x", "y"), target_kind="regression")
    dm = LMDBDataModule(listing, source_options=options, cache_dir=tmp_path / "c")
    assert dm.hparams["source_options"] == {"label_column": ["x", "y"], "target_kind": "regression"} and _plain(dict(dm.hparams))
    assert dm.hparams["manifest"] is None, "the deprecated name is never saved"
    buffer = io.BytesIO()
    torch.save(dict(dm.hparams), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert LMDBDataModule(**loaded).build_options.manifest == dm.build_options.manifest, "the hyper-parameters rebuild the module"
    assert LMDBDataModule(listing, cache_dir=tmp_path / "c").hparams["source_options"] is None, "none set: None, as the signature's default"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"label_colum": "tags"}, r"'label_colum' unknown.*label_column.*Hydra: data\.source_options\."),
        ({"target_kind": "ordinal"}, r"target_kind='ordinal' is not one of .*'multilabel'.*Hydra: data\.source_options\."),
        ("tags", r"source_options='tags' must be a mapping of source options.*data\.source_options\.label_column=tags"),
    ],
)
def test_bad_source_options_are_refused_naming_the_key(listing: Path, tmp_path: Path, options: object, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        LMDBDataModule(listing.parent, source_options=options, cache_dir=tmp_path / "cache")  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["source_options", "manifest"])
def test_hydras_source_options_node_reaches_the_kind(list_kind, listing: Path, tmp_path: Path, key: str) -> None:
    """``data.source_options.<option>=...``; the old key ``data.manifest.<option>=...`` still works, with a warning."""
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[f"data.train_dir={listing}", f"paths.data_dir={tmp_path}", f"data.{key}.label_column=tags",
                                          f"data.{key}.classes=[a,b]", f"data.{key}.label_sep=|"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dm = instantiate(cfg.data)
    renamed = [w for w in caught if issubclass(w.category, DeprecationWarning) and "source_options" in str(w.message)]
    assert len(renamed) == (key == "manifest"), [str(w.message) for w in caught]
    assert dm.build_options.manifest == EXPECTED and dm.hparams["source_options"] == GIVEN and _plain(dict(dm.hparams))
    assert dm.num_classes == 2
    assert list_kind.CALLS and all(options == EXPECTED for _, options in list_kind.CALLS), list_kind.CALLS


FLAGS = ["--root", "ROOT", "--path-column", "file", "--label-column", "x,y", "--split-column", "fold", "--target-kind", "regression",
         "--label-sep", ";", "--classes", "a, b"]


def test_the_build_flags_are_the_manifest_options(list_kind, listing: Path, tmp_path: Path) -> None:
    flags = [value.replace("ROOT", str(listing.parent)) for value in FLAGS]
    expected = SourceOptions(root=str(listing.parent), path_column="file", label_column=("x", "y"), split_column="fold",
                               target_kind="regression", label_sep=";", classes=("a", "b"))
    assert build_options(make_parser().parse_args(["build", "s", "t", *flags])).manifest == expected
    assert build_options(make_parser().parse_args(["build", "s", "t", "--label-column", "tags"])).manifest == SourceOptions(
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
    assert list_kind.CALLS == [("scan", SourceOptions(label_sep="|", classes=("a", "b")))]
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
    dm = LMDBDataModule(images / "train.csv", source_options={"label_column": "x,y"}, val_fraction=0, cache_dir=tmp_path / "cache",
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


# --- the old names: kept for one release, each warning with the new name ---------------------------------------------------------


def test_manifest_options_is_silent_to_import_and_warns_when_constructed() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from lightning_lmdb.sources import ManifestOptions  # a stable import path: reading it never warns
        assert isinstance(SourceOptions(), ManifestOptions) and issubclass(SourceOptions, ManifestOptions)
    with pytest.warns(DeprecationWarning, match=r"ManifestOptions is deprecated, use lightning_lmdb\.sources(\.base)?\.SourceOptions"):
        old = ManifestOptions(label_column="tags", label_sep="|", classes=["a", "b"])
    assert type(old) is SourceOptions and old == EXPECTED, "an instance made through the old name is a plain SourceOptions"
    with pytest.warns(DeprecationWarning, match="SourceOptions"):
        assert ManifestOptions.of(GIVEN) == EXPECTED
    with pytest.raises(OptionError, match="label_colum"):
        ManifestOptions.of({"label_colum": "x"})  # refused as SourceOptions.of refuses it


def test_the_manifest_keyword_warns_and_still_reads_the_source(list_kind, listing: Path, tmp_path: Path) -> None:
    with pytest.warns(DeprecationWarning, match=r"manifest=\.\.\.\) is deprecated, use source_options="):
        dm = LMDBDataModule(listing, manifest=GIVEN, val_fraction=0, cache_dir=tmp_path / "cache", num_workers=0, build_workers=0)
    assert dm.build_options.manifest == EXPECTED and dm.num_classes == 2
    assert dm.hparams["source_options"] == GIVEN and dm.hparams["manifest"] is None, "saved under the new name"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # unset (None, or Hydra's node of None fields): nothing given, no warning
        LMDBDataModule(listing, manifest={"label_column": None}, source_options=GIVEN, cache_dir=tmp_path / "cache")
    with pytest.warns(DeprecationWarning), pytest.raises(OptionError, match="both given: pass source_options alone"):
        LMDBDataModule(listing, manifest={"label_column": "x"}, source_options=GIVEN, cache_dir=tmp_path / "cache")


def test_an_old_checkpoints_manifest_hyper_parameter_still_loads(list_kind, listing: Path, tmp_path: Path) -> None:
    """Hyper-parameters saved before the rename hold ``manifest`` (and no ``source_options``): they rebuild the same module."""
    new = dict(LMDBDataModule(listing, source_options=GIVEN, cache_dir=tmp_path / "c").hparams)
    old = {key: value for key, value in new.items() if key != "source_options"} | {"manifest": new["source_options"]}
    buffer = io.BytesIO()
    torch.save(old, buffer)
    buffer.seek(0)
    with pytest.warns(DeprecationWarning, match="source_options"):
        restored = LMDBDataModule(**torch.load(buffer, weights_only=True))
    assert restored.build_options.manifest == EXPECTED and restored.hparams["source_options"] == GIVEN
    assert restored.database_path("train") == LMDBDataModule(listing, source_options=GIVEN, cache_dir=tmp_path / "c").database_path("train")
