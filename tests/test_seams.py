"""The extension seams, each added from the test alone through its registration function: a source kind
(``sources.register_source_kind``; the ``list`` kind of ``seamkit``), a storage mode and a record codec
(``codec.register_storage_mode`` / ``codec.register_record_codec``), a decoder (``decoders.register_decoder``) and a target kind
(``targets.register_target_kind``; the ``keypoints`` kind of ``seamkit``, with its loss: ``target_losses.register_loss``)."""

from __future__ import annotations

import os
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from imagegen import read_records
from PIL import Image

from lightning_lmdb import options, targets
from lightning_lmdb.build.writer import build_lmdb
from lightning_lmdb.codec import decoders
from lightning_lmdb.codec import storage as codec
from lightning_lmdb.datamodule.module import LMDBDataModule
from lightning_lmdb.errors import DatabaseError, OptionError
from lightning_lmdb.read.dataset import LMDBImageDataset
from lightning_lmdb.read.transforms import ResizedCrop, eval_transform
from lightning_lmdb.sources import base as sources
from lightning_lmdb.store.database import load_meta
from lightning_lmdb.tools.cli import make_parser
from lightning_lmdb.tools.verify import verify_lmdb

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_a_source_kind_is_one_module(list_kind, tmp_path: Path) -> None:
    listing = list_kind.write_listing(tmp_path, [(2, 1), (0, 0), (1, 1)])
    images = listing.parent

    target = build_lmdb(listing, tmp_path / "out.lmdb", storage="encoded", workers=0, progress=False)

    meta, values = read_records(target)
    assert meta["paths"] == ["2.png", "0.png", "1.png"] and meta["targets"] == [1, 0, 1]
    assert values == [(images / name).read_bytes() for name in ("2.png", "0.png", "1.png")]
    assert [LMDBImageDataset(target)[i][1] for i in range(3)] == [1, 0, 1]

    data = LMDBDataModule(train_dir=listing, val_fraction=0, cache_dir=tmp_path / "cache", batch_size=3, num_workers=0,
                          image_size=4, train_transform=eval_transform(4))
    assert data.num_classes == 2
    data.prepare_data()
    data.setup("fit")
    _, labels = next(iter(data.train_dataloader()))
    assert sorted(labels.tolist()) == [0, 1, 1]


def test_an_unknown_source_is_refused_naming_it(tmp_path: Path) -> None:
    stray = tmp_path / "labels.list"
    stray.write_text("")
    with pytest.raises(FileNotFoundError, match="labels.list"):
        sources.scan_source(stray)


def test_a_malformed_json_is_refused_with_what_the_kinds_accept(tmp_path: Path) -> None:
    """The message lists every registered kind by its DESCRIPTION: true for a ``.json`` (not a manifest), and for a new kind."""
    stray = tmp_path / "labels.json"
    stray.write_text("{not json")
    with pytest.raises(FileNotFoundError) as raised:
        sources.scan_source(stray)
    message = str(raised.value)
    assert "labels.json" in message and "is a file that is none of" in message and "neither a folder nor a manifest" not in message
    for name in ("manifest", "folder"):
        assert sources.describe_kind(name) in message
    assert "map-style Dataset" not in message, "a path is never a Dataset: that kind is not offered for one"
    with pytest.raises(FileNotFoundError, match="a map-style Dataset"):
        sources.scan_source(object())


def test_a_registered_kinds_description_reaches_the_messages_and_the_cli_help(list_kind, tmp_path: Path,
                                                                               capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(FileNotFoundError, match=r"a \.list file of"):
        sources.scan_source(tmp_path / "missing.list")
    from lightning_lmdb.tools.cli import make_parser

    with pytest.raises(SystemExit):
        make_parser().parse_args(["build", "--help"])
    assert "a .list file of" in " ".join(capsys.readouterr().out.split())
    sources.unregister_source_kind(list_kind)
    with pytest.raises(FileNotFoundError) as raised:
        sources.scan_source(tmp_path / "missing.list")
    assert "a .list file" not in str(raised.value)


def test_kind_of_remembers_a_sources_kind_until_it_changes_or_a_kind_is_registered(tmp_path: Path) -> None:
    calls: list[object] = []

    class Counting:
        NAME, DESCRIPTION = "counting", "anything it is asked about (counts the questions)"

        def accepts(self, source: object) -> bool:
            calls.append(source)
            return False

        scan = has_samples = classes = None

    counting = sources.register_source_kind(Counting(), before="manifest")
    try:
        folder = tmp_path / "images"
        folder.mkdir()
        os.utime(folder, ns=(time.time_ns() - 10**10,) * 2)  # 10 s old
        assert sources.kind_of(folder).NAME == "folder"
        assert sources.kind_of(str(folder)).NAME == "folder" and len(calls) == 1, "asked once per path"
        (folder / "metadata.csv").write_text("file_name,label\n")  # the folder's mtime changes: asked again, each time while recent
        assert sources.kind_of(folder).NAME == "manifest" and sources.kind_of(folder).NAME == "manifest" and len(calls) == 3
        os.utime(folder, ns=(time.time_ns() - 10**10,) * 2)
        assert sources.kind_of(folder).NAME == "manifest" and sources.kind_of(folder).NAME == "manifest" and len(calls) == 4
        missing = tmp_path / "later"
        assert sources.kind_of(missing) is None and sources.kind_of(missing) is None and len(calls) == 6, "a miss is never remembered"

        class Samples:
            def __len__(self) -> int:
                return 1

            def __getitem__(self, i: int) -> int:
                return i

        dataset = Samples()
        assert sources.kind_of(dataset).NAME == "datasource" and sources.kind_of(dataset).NAME == "datasource" and len(calls) == 7
        sources.register_source_kind(counting, before="manifest")  # a registration forgets every answer
        assert sources.kind_of(dataset).NAME == "datasource" and sources.kind_of(folder).NAME == "manifest" and len(calls) == 9
    finally:
        sources.unregister_source_kind(counting)
    assert [sources.kind_name(kind) for kind in sources.source_kinds()] == ["manifest", "coco", "yolo", "voc", "folder", "datasource"]


def test_a_source_kind_lacking_a_member_is_refused_naming_it() -> None:
    class Half:
        NAME, DESCRIPTION = "half", "half a kind"

        def accepts(self, source: object) -> bool:
            return False

    with pytest.raises(OptionError, match="'half' lacks scan, has_samples, classes"):
        sources.register_source_kind(Half())
    with pytest.raises(OptionError, match="before='nope' names no registered source kind"):
        sources.register_source_kind(sources.kind_of(Path(".")), before="nope")


def test_source_kinds_is_still_readable_deprecated() -> None:
    with pytest.warns(DeprecationWarning, match="register_source_kind"):
        kinds = tuple(f"lightning_lmdb.sources.{name}" for name in ("manifest", "coco", "yolo", "voc", "folder", "dataset"))
        assert sources.SOURCE_KINDS == kinds


@pytest.fixture
def zlib_mode():
    """A zlib-compressed pixel mode: one StorageMode, and one RecordCodec for its new record layout, registered from the test."""
    pixels = codec.RECORD_CODECS[codec.PIXELS]
    record = codec.register_record_codec(codec.RecordCodec(
        len(codec.RECORD_CODECS), "zlib pixels", file_bytes=False,
        decode=lambda value, decoder, size, name: pixels.decode(zlib.decompress(value), decoder, size, name)))
    decoded = codec.STORAGE_MODES["decoded"]

    def encode(data: bytes, image: Image.Image, resize: int | None, quality: int) -> tuple[int, bytes]:
        return record.id, zlib.compress(decoded.encode(data, image, resize, quality)[1])

    yield codec.register_storage_mode(codec.StorageMode("zlib", encode, default_codec=None))
    codec.unregister_storage_mode("zlib")
    codec.unregister_record_codec(record)


def _pngs(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    (source / "cat").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 255, (7, 9, 3), dtype=np.uint8)).save(source / "cat" / f"{i}.png")
    return source


def test_a_storage_mode_is_one_registry_entry(zlib_mode: codec.StorageMode, tmp_path: Path) -> None:
    source = _pngs(tmp_path)

    target = build_lmdb(source, tmp_path / "zlib.lmdb", storage="zlib", workers=0, progress=False)

    dataset = LMDBImageDataset(target)
    for i, path in enumerate(sorted((source / "cat").iterdir())):
        image, label = dataset[i]
        assert label == 0 and np.array_equal(np.asarray(image), np.asarray(Image.open(path).convert("RGB")))
    report = verify_lmdb(target, source=source)
    assert report.ok and report.checked == 3, report.problems
    assert options.CHOICES["storage"][-1] == "zlib" and make_parser().parse_args(["build", "s", "t", "--storage", "zlib"]).storage == "zlib"
    codec.unregister_storage_mode("zlib")
    with pytest.raises(OptionError, match="storage='zlib' is not one of 'auto', 'encoded', 'decoded'"):
        options.BuildOptions(storage="zlib")
    with pytest.raises(DatabaseError, match="register_storage_mode"):
        LMDBImageDataset(target)


def test_a_registered_storage_mode_is_a_plain_hydra_value(zlib_mode: codec.StorageMode, tmp_path: Path) -> None:
    """No configs/storage file: ``data.storage=zlib`` reaches the DataModule and its build."""
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[f"data.train_dir={_pngs(tmp_path)}", f"paths.data_dir={tmp_path}", "data.storage=zlib",
                                          "data.val_fraction=0", "data.num_workers=0"])
    data = instantiate(cfg.data)
    assert data.build_options.storage == "zlib"
    data.prepare_data()
    meta, values = read_records(data.database_path("train"))
    assert meta["storage"] == "zlib" and all(codec.decode_pixels(zlib.decompress(value)).shape == (7, 9, 3) for value in values)


def test_a_record_codec_keeps_its_id() -> None:
    with pytest.raises(OptionError, match="has id 2; the next free id is 6"):
        codec.register_record_codec(codec.RecordCodec(2, "mine", codec.RECORD_CODECS[1].decode, file_bytes=False))
    assert codec.register_record_codec(codec.RECORD_CODECS[2]) is codec.RECORD_CODECS[2], "registering a codec again changes nothing"


def _negative_db(tmp_path: Path) -> tuple[Path, list[np.ndarray]]:
    source = tmp_path / "src" / "cat"
    source.mkdir(parents=True)
    rng = np.random.default_rng(1)
    pixels = [rng.integers(0, 255, (5, 6, 3), dtype=np.uint8) for _ in range(3)]
    for i, image in enumerate(pixels):
        Image.fromarray(image).save(source / f"{i}.png")
    return build_lmdb(source.parent, tmp_path / "png.lmdb", storage="encoded", workers=0, progress=False), pixels


@pytest.fixture
def negative_decoder():
    """``seamdecoder``'s ``"negative"`` decoder, registered on its import, removed (and the module forgotten) after the test."""
    import seamdecoder

    decoders.register_decoder(seamdecoder.NEGATIVE)  # again, should an earlier test have removed it
    yield seamdecoder
    decoders.unregister_decoder("negative")
    sys.modules.pop("seamdecoder", None)


def _read_all(dataset: LMDBImageDataset, context: str) -> list[np.ndarray]:
    loader = torch.utils.data.DataLoader(dataset, batch_size=3, num_workers=1, multiprocessing_context=context)
    images, labels = next(iter(loader))
    assert labels.tolist() == [0, 0, 0]
    return [image.permute(1, 2, 0).numpy() for image in images]


def test_a_decoder_is_one_registry_entry(negative_decoder, tmp_path: Path) -> None:
    """Registered from the test alone: the dataset accepts its name and forked loader workers decode with it."""
    target, pixels = _negative_db(tmp_path)
    dataset = LMDBImageDataset(target, decoder="negative")
    assert [np.array_equal(image, 255 - p) for image, p in zip(_read_all(dataset, "fork"), pixels)] == [True] * 3
    assert any(line.startswith("negative: ") for line in decoders.parity_policy())
    decoders.unregister_decoder("negative")
    with pytest.raises(OptionError, match="decoder='negative' is not one of .*register_decoder"):
        LMDBImageDataset(target, decoder="negative")


@pytest.mark.slow
def test_a_decoder_reaches_spawned_workers_through_a_module_they_import(negative_decoder, tmp_path: Path) -> None:
    target, pixels = _negative_db(tmp_path)
    dataset = LMDBImageDataset(target, transform=negative_decoder.keep, decoder="negative")
    assert [np.array_equal(image, 255 - p) for image, p in zip(_read_all(dataset, "spawn"), pixels)] == [True] * 3
    plain = LMDBImageDataset(target, decoder="negative")  # nothing the worker unpickles imports seamdecoder
    with pytest.raises(Exception, match="register_decoder"):
        _read_all(plain, "spawn")


@pytest.fixture
def keypoints_kind():
    """``seamkit``'s ``keypoints`` target kind and its toy-model loss, registered at run time (not on the module's import)."""
    import seamkit

    from lightning_lmdb.experiment import target_losses

    kind = targets.register_target_kind(seamkit.KeypointsKind())
    target_losses.register_loss("keypoints", seamkit.keypoints_loss, seamkit.keypoints_metric, metric_name="mae")
    yield kind
    targets.unregister_target_kind("keypoints")
    target_losses.unregister_loss("keypoints")


def _points_db(tmp_path: Path, count: int = 4) -> Path:
    import seamkit

    return build_lmdb(seamkit.PointImages(count), tmp_path / "points.lmdb", workers=0, progress=False,
                      manifest={"target_kind": "keypoints", "version": 1})


def test_a_target_kind_is_one_registry_entry(keypoints_kind, tmp_path: Path) -> None:
    """Registered from the test alone: a Dataset of points builds, stores them as typed arrays and serves them."""
    assert "keypoints" in sources.TARGET_KINDS and sources.SourceOptions(target_kind="keypoints").target_kind == "keypoints"
    target = _points_db(tmp_path)

    meta = load_meta(target)
    assert meta.target_kind == "keypoints" and meta.version == 3
    assert meta.label_offsets.tolist() == [0, 2, 6, 8, 12] and meta.values.tolist() == [3, 1, 3, 1, 4, 4, 3, 1, 3, 1, 4, 4]
    plain = LMDBImageDataset(target)
    assert [plain[i][1].tolist() for i in range(2)] == [[[3.0, 1.0]], [[3.0, 1.0], [4.0, 4.0]]]
    assert verify_lmdb(target).ok
    targets.unregister_target_kind("keypoints")
    with pytest.raises(DatabaseError, match=r"holds targets of kind 'keypoints', not one of 'class', .*register_target_kind\(\)"):
        LMDBImageDataset(target)


def test_a_manifest_column_feeds_a_registered_target_kind(keypoints_kind, tmp_path: Path) -> None:
    """A JSON Lines manifest's column of points, read through the kind's ``hold``; a cell it refuses is named by its line."""
    import json

    for i in range(2):
        Image.new("RGB", (8, 8)).save(tmp_path / f"{i}.png")
    rows = [{"path": "0.png", "points": [1, 2, 3, 4]}, {"path": "1.png", "points": []}]
    manifest = tmp_path / "points.jsonl"
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    target = build_lmdb(manifest, tmp_path / "m.lmdb", workers=0, progress=False,
                        manifest={"target_kind": "keypoints", "label_column": "points"})
    served = LMDBImageDataset(target)
    assert served.target_kind == "keypoints" and [served[i][1].tolist() for i in range(2)] == [[[1.0, 2.0], [3.0, 4.0]], []]
    manifest.write_text(json.dumps({"path": "0.png", "points": [1, 2, 3]}) + "\n")
    with pytest.raises(Exception, match=r"line 1.*not a flat list of x, y coordinates"):
        build_lmdb(manifest, tmp_path / "bad.lmdb", workers=0, progress=False,
                   manifest={"target_kind": "keypoints", "label_column": "points"})


def test_a_target_kinds_geometry_moves_its_points_with_the_image(keypoints_kind, tmp_path: Path) -> None:
    target = _points_db(tmp_path)
    # the whole 8 x 8 image resized to 4 x 4 (scale and ratio 1: the crop is the image) and always flipped
    flipped = LMDBImageDataset(target, transform=ResizedCrop(4, train=True, scale=(1.0, 1.0), ratio=(1.0, 1.0), hflip=1.0),
                               decoder="pil")
    image, points = flipped[1]
    # (3, 1) -> (1.5, 0.5) at half size -> x mirrored: (4 - 1.5, 0.5); (4, 4) -> (2, 2) -> (2, 2)
    assert points.tolist() == [[2.5, 0.5], [2.0, 2.0]]
    brightest = divmod(int(image[0].argmax()), 4)  # (row, column) of the white block's pixel after the resize and the flip
    assert image.shape == (3, 4, 4) and brightest == (0, 2), "the white block moved where its point (x 2.5, y 0.5) did"
    # evaluation: the shorter side resized to 6 (resize_ratio 1.5), then the centre 4 x 4 (1 pixel off each side)
    centred, = [LMDBImageDataset(target, transform=eval_transform(4, resize_ratio=1.5))[1][1]]
    assert centred.tolist() == [[(3 * 6 / 8) - 1, (1 * 6 / 8) - 1], [2.0, 2.0]]


def test_an_unknown_target_kind_is_refused_naming_it_the_kinds_and_how_to_register() -> None:
    with pytest.raises(OptionError, match=r"target_kind='keypoints' is not one of 'class', .*'mask'.*register_target_kind"):
        targets.target_kind("keypoints")
    with pytest.raises(OptionError, match=r"target_kind='keypoints' is not one of .*\(or None to infer it\).*register_target_kind"):
        sources.SourceOptions(target_kind="keypoints")
    assert [kind.name for kind in targets.target_kinds()] == ["class", "multilabel", "regression", "none", "mask", "boxes"]


def _train_points(tmp_path: Path, context: str | None) -> list[list[int]]:
    """Trains ``ToyCNN`` on the points database a few steps (``context``: its loader workers' start method; one persistent
    worker serves both epochs: a spawned one starts once); the number of points of each image of each batch the model got."""
    import lightning.pytorch as pl
    import seamkit

    from lightning_lmdb.experiment.toy_model import ToyCNN

    seen: list[list[int]] = []

    class Model(ToyCNN):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            images, points = batch
            assert isinstance(points, list) and images.shape == (len(points), 3, 4, 4)
            seen.append([len(p) for p in points])
            return super().training_step(batch, batch_idx)

    data = LMDBDataModule(train_dir=seamkit.PointImages(6), manifest={"target_kind": "keypoints", "version": 1}, val_fraction=0,
                          cache_dir=tmp_path / "cache", batch_size=3, num_workers=1 if context else 0, image_size=4,
                          multiprocessing_context=context, shuffle=False, persistent_workers=True)
    assert data.target_kind == "keypoints"
    model = Model(target_kind="keypoints", num_outputs=2, width=4)
    trainer = pl.Trainer(max_steps=4, max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, datamodule=data)
    assert torch.isfinite(trainer.callback_metrics["train/loss"]) and "train/mae" in trainer.callback_metrics
    return seen


def test_a_datamodule_trains_on_a_registered_target_kind(keypoints_kind, tmp_path: Path) -> None:
    assert _train_points(tmp_path, None) == [[1, 2, 1], [2, 1, 2]] * 2


@pytest.mark.slow
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_target_kind_registered_at_run_time_reaches_loader_workers(keypoints_kind, tmp_path: Path, context: str) -> None:
    """A spawned worker starts a fresh interpreter where seamkit registers nothing: the kind arrives with the dataset (a
    registered kind pickles by its class and registers itself where it is unpickled)."""
    assert _train_points(tmp_path, context) == [[1, 2, 1], [2, 1, 2]] * 2
