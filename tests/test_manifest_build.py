"""Manifest sources end to end: every target kind built, served and checked against a hand-written reference Dataset."""

from __future__ import annotations

import csv
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from imagegen import MODE_FILES, make_folder, make_image, save_image
from PIL import Image

from lightning_lmdb.build.writer import build, build_lmdb
from lightning_lmdb.errors import BuildError, SourceError, StaleDatabaseError
from lightning_lmdb.read.dataset import LMDBImageDataset
from lightning_lmdb.read.raw import RawImageDataset
from lightning_lmdb.sources.base import SourceOptions
from lightning_lmdb.store import database
from lightning_lmdb.tools.verify import describe_lmdb, verify_lmdb

NAMES = ("cat", "dog", "ñandú")


class Reference(torch.utils.data.Dataset):
    """What a user would write by hand: PIL and the manifest's rows, no lightning_lmdb code."""

    def __init__(self, rows: list[dict], root: Path, kind: str, classes: list[str], label: str | list[str] = "label"):
        self.rows, self.root, self.kind, self.classes, self.label = rows, root, kind, classes, label

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        row = self.rows[i]
        image = Image.open(self.root / row["path"]).convert("RGB")
        if self.kind == "class":
            return image, self.classes.index(row["label"])
        if self.kind == "multilabel":
            hot = torch.zeros(len(self.classes))
            for name in row["label"]:
                hot[self.classes.index(name)] = 1
            return image, hot
        if self.kind == "regression":
            columns = self.label if isinstance(self.label, list) else [self.label]
            return image, torch.tensor([float(row[c]) for c in columns], dtype=torch.float32)
        return image, -1


def _images(root: Path, count: int = 12) -> list[str]:
    """``count`` images of mixed modes under ``root``, some in subfolders and with non-ASCII names; their relative paths."""
    rng = np.random.default_rng(7)
    paths = []
    for i in range(count):
        stem, mode, ext = MODE_FILES[i % len(MODE_FILES)]
        relpath = f"{'sub/' if i % 3 == 0 else ''}{stem} é {i}{ext}"
        save_image(make_image(mode, (20 + i, 16 + i % 5), rng), root / relpath)
        paths.append(relpath)
    return paths


def _rows(paths: list[str], kind: str) -> list[dict]:
    rng = np.random.default_rng(3)
    rows = []
    for i, path in enumerate(paths):
        if kind == "class":
            label = NAMES[i % 3]
        elif kind == "multilabel":
            label = sorted({NAMES[j] for j in rng.integers(0, 3, size=i % 3)})  # some rows have no label at all
        elif kind == "regression":
            label = round(float(rng.normal()), 4)
        else:
            label = None
        rows.append({"path": path, **({} if label is None else {"label": label}), "y2": round(i * 0.25, 2)})
    return rows


def _write(path: Path, rows: list[dict], sep: str = "|") -> Path:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    else:
        columns = list(dict.fromkeys(k for r in rows for k in r))
        with path.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle, delimiter="\t" if path.suffix == ".tsv" else ",")
            writer.writerow(columns)
            for r in rows:
                writer.writerow([sep.join(r[c]) if isinstance(r.get(c), list) else r.get(c, "") for c in columns])
    return path


def _same(samples_a, samples_b) -> None:
    assert len(samples_a) == len(samples_b)
    for i in range(len(samples_a)):
        (image_a, target_a), (image_b, target_b) = samples_a[i], samples_b[i]
        assert np.array_equal(np.asarray(image_a), np.asarray(image_b)), f"image {i}"
        if isinstance(target_b, torch.Tensor):
            assert isinstance(target_a, torch.Tensor) and target_a.dtype == torch.float32 and torch.equal(target_a, target_b), i
        else:
            assert target_a == target_b and isinstance(target_a, int), i


CASES = [  # (kind, manifest suffix, options)
    ("class", ".csv", {}),
    ("class", ".jsonl", {}),
    ("multilabel", ".jsonl", {}),
    ("multilabel", ".csv", {"label_sep": "|"}),
    ("regression", ".jsonl", {}),
    ("regression", ".tsv", {"target_kind": "regression"}),
    ("none", ".csv", {}),
]


@pytest.mark.parametrize(("kind", "suffix", "options"), CASES, ids=[f"{k}{s}" for k, s, _ in CASES])
def test_every_kind_equals_a_hand_written_reference(tmp_path: Path, kind: str, suffix: str, options: dict) -> None:
    paths = _images(tmp_path / "data")
    rows = _rows(paths, kind)
    manifest = _write(tmp_path / "data" / f"labels{suffix}", rows)
    labelled = kind in ("class", "multilabel")
    classes = sorted({n for r in rows for n in ([r["label"]] if kind == "class" else r["label"])}) if labelled else []
    reference = Reference(rows, tmp_path / "data", kind, classes)
    db = build_lmdb(manifest, tmp_path / "out.lmdb", workers=0, progress=False, **options)
    served = LMDBImageDataset(db)
    assert served.target_kind == kind and served.classes == classes
    _same(served, reference)
    _same(RawImageDataset(manifest, manifest=SourceOptions(**options)), reference)
    assert served.paths == paths, "rows in the file's order"
    if kind == "regression":
        assert served.target_names == ["label"]
    info = describe_lmdb(db)
    assert info["target_kind"] == kind and info["format_version"] == (3 if kind in ("multilabel", "regression") else 2)
    assert verify_lmdb(db, manifest, manifest=SourceOptions(**options)).ok
    assert verify_lmdb(db, manifest).ok, "without options, verify reads the manifest as the build did"
    assert database.load_meta(db).options.get("manifest") == (options or None), "the database records how it was read"


def test_regression_over_several_columns(tmp_path: Path) -> None:
    paths = _images(tmp_path / "data", 6)
    rows = _rows(paths, "regression")
    manifest = _write(tmp_path / "data" / "labels.csv", rows)
    db = build_lmdb(manifest, tmp_path / "out.lmdb", workers=0, progress=False, label_column="label,y2", target_kind="regression")
    served = LMDBImageDataset(db)
    assert served.target_names == ["label", "y2"]
    _same(served, Reference(rows, tmp_path / "data", "regression", [], ["label", "y2"]))


def test_a_folder_and_its_csv_manifest_give_identical_samples(tmp_path: Path) -> None:
    folder = make_folder(tmp_path / "folder", per_class=4)
    by_folder = LMDBImageDataset(build_lmdb(folder, tmp_path / "a.lmdb", workers=0, progress=False))
    rows = [{"path": p, "label": p.split("/")[0]} for p in by_folder.paths]  # ImageFolder's order, folder names as labels
    manifest = _write(tmp_path / "labels.csv", rows)
    by_manifest = LMDBImageDataset(build_lmdb(manifest, tmp_path / "b.lmdb", workers=0, progress=False, root=str(folder)))
    assert by_manifest.class_to_idx == by_folder.class_to_idx and by_manifest.classes == by_folder.classes
    assert by_manifest.targets == by_folder.targets
    _same(by_manifest, by_folder)


def test_sharded_build_of_a_multilabel_manifest_serves_the_same_samples(tmp_path: Path) -> None:
    paths = _images(tmp_path / "data", 9)
    manifest = _write(tmp_path / "data" / "labels.jsonl", _rows(paths, "multilabel"))
    single = LMDBImageDataset(build_lmdb(manifest, tmp_path / "one.lmdb", workers=0, progress=False))
    sharded = LMDBImageDataset(build_lmdb(manifest, tmp_path / "three.lmdb", workers=0, progress=False, shards=3))
    assert sharded.sharded and sharded.target_kind == "multilabel" and sharded.targets == single.targets
    _same(sharded, single)


def test_splits_come_from_the_split_column(tmp_path: Path) -> None:
    paths = _images(tmp_path / "data", 10)
    rows = [{**r, "split": ("train", "val", "test")[i % 3]} for i, r in enumerate(_rows(paths, "class"))]
    db = build_lmdb(_write(tmp_path / "data" / "labels.csv", rows), tmp_path / "out.lmdb", workers=0, progress=False)
    served = LMDBImageDataset(db)
    assert served.split_names == ["train", "val", "test"]
    for name in served.split_names:
        assert [served.paths[r] for r in served.rows_of_split(name)] == [r["path"] for r in rows if r["split"] == name]
    assert database.load_meta(db).version == 3 and describe_lmdb(db)["splits"] == {"train": 4, "val": 3, "test": 3}


def test_a_relabelled_manifest_is_stale_and_verify_names_the_record(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    paths = _images(tmp_path / "data", 6)
    rows = _rows(paths, "class")
    manifest = _write(tmp_path / "data" / "labels.csv", rows)
    db = build_lmdb(manifest, tmp_path / "out.lmdb", workers=0, progress=False)
    assert build(manifest, db, workers=0, progress=False).action == "up-to-date"
    was = rows[2]["label"]
    rows[2]["label"] = "dog" if was != "dog" else "cat"
    _write(manifest, rows)
    report = verify_lmdb(db, manifest)
    now = rows[2]["label"]
    assert report.problems == [f"record 2 ({paths[2]}): target {was!r} in the database, {now!r} in the source (relabelled since)"]
    with pytest.raises(StaleDatabaseError, match=r"from a source that changed since \(0 files added, 0 removed, 1 relabelled\)\."):
        build(manifest, db, workers=0, progress=False, on_stale="error")
    with caplog.at_level(logging.WARNING, logger="lightning_lmdb"):  # what the DataModule's build says: a warning, seen outside Hydra
        assert build(manifest, db, workers=0, progress=False).action == "built"
    assert "(0 files added, 0 removed, 1 relabelled); rebuilding it." in caplog.text
    assert LMDBImageDataset(db).targets[2] == sorted(NAMES[:2] + ("ñandú",)).index(rows[2]["label"])
    rows[4]["label"] = "aardvark"  # a new class: every index after it shifts, one record is relabelled
    _write(manifest, rows)
    report = verify_lmdb(db, manifest)
    assert report.problems == [f"the source's classes are {['aardvark', *sorted(NAMES)]}, the database's {sorted(NAMES)}: the class "
                               f"indices differ", f"record 4 ({paths[4]}): target {NAMES[4 % 3]!r} in the database, 'aardvark' in the "
                               "source (relabelled since)"]
    with pytest.raises(StaleDatabaseError, match=r"\(0 files added, 0 removed, 1 relabelled, the classes are now \['aardvark', 'cat', "
                                                 r"'dog', 'ñandú'\], were \['cat', 'dog', 'ñandú'\]\)"):
        build(manifest, db, workers=0, progress=False, on_stale="error")
    os.utime(tmp_path / "data" / paths[0], ns=(1, 1))
    rows[4]["label"] = NAMES[4 % 3]
    _write(manifest, rows)
    with pytest.raises(StaleDatabaseError, match=r"\(0 files added, 0 removed, 0 relabelled, so files were modified \(their size or "):
        build(manifest, db, workers=0, progress=False, on_stale="error")


BAD_ROWS = {  # what the row holds -> (the text the error names, beside the line)
    "missing image": ({"path": "nowhere.png", "label": "cat"}, "nowhere.png: cannot read the file: no such file"),
    "unreadable image": ({"path": "corrupt.jpg", "label": "cat"}, "corrupt.jpg"),
    "empty label": ({"path": "{ok}", "label": ""}, "label"),
    "label not in classes": ({"path": "{ok}", "label": "dgo"}, "dgo"),
    "path escaping root": ({"path": "../outside.png", "label": "cat"}, "outside.png"),
    "duplicate path": ({"path": "{first}", "label": "cat"}, "line 2"),
    "duplicate written as an absolute path": ({"path": "{root}/./{first}", "label": "dog"}, "line 2 lists it already"),
    "NUL in the path": ({"path": "a\0b.png", "label": "cat"}, "cannot be a file name (it holds a NUL character)"),
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_a_bad_row_names_its_line_and_leaves_no_database(tmp_path: Path, case: str) -> None:
    paths = _images(tmp_path / "data", 5)
    (tmp_path / "data" / "corrupt.jpg").write_bytes(b"\xff\xd8 not really a JPEG")
    rows = _rows(paths[:4], "class")
    bad, named = BAD_ROWS[case]
    bad = {k: v.format(ok=paths[4], first=paths[0], root=tmp_path.resolve() / "data") for k, v in bad.items()}  # paths[4]: no other row's
    manifest = _write(tmp_path / "data" / "labels.csv", [*rows, bad])
    target = tmp_path / "out.lmdb"
    with pytest.raises((BuildError, SourceError)) as caught:
        build_lmdb(manifest, target, workers=0, progress=False, classes=list(NAMES))
    message = str(caught.value)
    assert "labels.csv line 6" in message and named in message and "permissions" not in message, message
    assert not target.exists(), "no finished database is left behind"
    report = build(manifest, target, workers=0, progress=False, classes=list(NAMES), on_error="skip")
    assert report.count == 4 and len(report.skipped) == 1 and "line 6" in report.skipped[0].reason


@pytest.mark.parametrize("case", ["unknown column", "empty manifest", "not UTF-8"])
def test_a_bad_manifest_file_names_the_file_and_leaves_no_database(tmp_path: Path, case: str) -> None:
    paths = _images(tmp_path / "data", 3)
    manifest = tmp_path / "data" / "labels.csv"
    options: dict = {}
    if case == "unknown column":
        _write(manifest, _rows(paths, "class"))
        options = {"label_column": "tags"}
    elif case == "empty manifest":
        manifest.write_text("path,label\n")
    else:
        manifest.write_bytes(b"path,label\n" + paths[0].encode("latin-1", "replace") + b",caf\xe9\n")
    target = tmp_path / "out.lmdb"
    with pytest.raises(SourceError, match="labels.csv"):
        build_lmdb(manifest, target, workers=0, progress=False, **options)
    assert not target.exists()


def _loader_samples(dm, split: str) -> tuple[torch.Tensor, list]:
    loader = {"train": dm.train_dataloader, "val": dm.val_dataloader, "test": dm.test_dataloader}[split]()
    images, targets = zip(*loader, strict=True)
    return torch.cat(images), [t for batch in targets for t in batch]


@pytest.mark.parametrize("backend", ["lmdb", "raw"])
@pytest.mark.parametrize("kind", ["class", "multilabel", "regression", "none"])
def test_datamodule_loaders_serve_the_reference(tmp_path: Path, kind: str, backend: str) -> None:
    from torchvision.transforms import v2

    from lightning_lmdb.datamodule.module import LMDBDataModule

    paths = _images(tmp_path / "data")
    rows = _rows(paths, kind)
    manifest = _write(tmp_path / "data" / "labels.jsonl", rows)
    same_size = v2.Compose([v2.PILToTensor(), v2.Resize((12, 12), antialias=False)])
    dm = LMDBDataModule(manifest, val_fraction=0, backend=backend, cache_dir=tmp_path / "cache", num_workers=0, batch_size=5,
                        shuffle=False, decoder="pil", build_workers=0, train_transform=same_size, eval_transform=same_size)
    labelled = kind in ("class", "multilabel")
    classes = sorted({n for r in rows for n in ([r["label"]] if kind == "class" else r["label"])}) if labelled else []
    assert dm.target_kind == kind and dm.classes == classes, "known before setup"
    dm.prepare_data()
    dm.setup("fit")
    images, targets = _loader_samples(dm, "train")
    reference = Reference(rows, tmp_path / "data", kind, classes)
    assert torch.equal(images, torch.stack([same_size(reference[i][0]) for i in range(len(reference))]))
    expected = [reference[i][1] for i in range(len(reference))]
    if kind in ("class", "none"):
        assert [int(t) for t in targets] == expected
    else:
        assert torch.equal(torch.stack(targets), torch.stack(expected)) and targets[0].dtype == torch.float32
    assert dm.target_kind == kind and dm.num_classes == len(classes)
    assert (dm.target_names == ["label"]) == (kind == "regression")


@pytest.mark.parametrize("backend", ["lmdb", "raw"])
def test_the_split_column_gives_the_datamodules_splits(tmp_path: Path, backend: str) -> None:
    from lightning_lmdb.datamodule.module import LMDBDataModule

    paths = _images(tmp_path / "data", 12)
    rows = [{**r, "split": ("train", "validation", "test", "train")[i % 4]} for i, r in enumerate(_rows(paths, "class"))]
    manifest = _write(tmp_path / "data" / "labels.csv", rows)
    dm = LMDBDataModule(manifest, backend=backend, cache_dir=tmp_path / "cache", num_workers=0, batch_size=4, build_workers=0,
                        val_fraction=0.5)  # the split column overrides it
    dm.prepare_data()
    dm.setup()
    for split, name in (("train", "train"), ("val", "validation"), ("test", "test")):
        assert dm.datasets[split].paths == [r["path"] for r in rows if r["split"] == name], split


@pytest.mark.slow
def test_datamodule_worker_processes_serve_a_multilabel_manifest(tmp_path: Path) -> None:
    from torchvision.transforms import v2

    from lightning_lmdb.datamodule.module import LMDBDataModule

    paths = _images(tmp_path / "data")
    rows = _rows(paths, "multilabel")
    manifest = _write(tmp_path / "data" / "labels.jsonl", rows)
    same_size = v2.Compose([v2.PILToTensor(), v2.Resize((12, 12), antialias=False)])
    served = {}
    for workers in (0, 2):
        dm = LMDBDataModule(manifest, val_fraction=0, cache_dir=tmp_path / "cache", num_workers=workers, batch_size=5, shuffle=False,
                            decoder="pil", build_workers=0, train_transform=same_size, eval_transform=same_size)
        dm.prepare_data()
        dm.setup("fit")
        images, targets = _loader_samples(dm, "train")
        served[workers] = (images, torch.stack(targets))
    assert torch.equal(served[0][0], served[2][0]) and torch.equal(served[0][1], served[2][1])


@pytest.mark.slow
def test_train_py_trains_on_a_multilabel_manifest_and_its_ab(tmp_path: Path) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    paths = _images(tmp_path / "data", 16)
    manifest = _write(tmp_path / "data" / "labels.jsonl", _rows(paths, "multilabel"))
    cmd = [sys.executable, "train.py", "-m", "data=raw,lmdb", f"data.train_dir={manifest}", f"data.cache_dir={tmp_path / 'cache'}",
           "trainer.max_epochs=1", f"paths.data_dir={tmp_path / 'demo'}", f"hydra.sweep.dir={tmp_path / 'runs'}", "data.image_size=16",
           "loader=debug", "data.build_workers=0", "trainer.enable_progress_bar=false", "model.width=8"]
    result = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summaries = sorted((tmp_path / "runs").rglob("perf_summary.json"))
    assert {json.loads(p.read_text())["backend"] for p in summaries} == {"raw", "lmdb"}, "both sides of the A/B ran and reported"
    metrics = "".join(p.read_text() for p in (tmp_path / "runs").rglob("metrics.csv"))
    assert "train/f1" in metrics and "train/acc" not in metrics, "the multi-label loss and metric were chosen"
    assert (tmp_path / "runs" / "comparison.txt").exists()
    assert not (tmp_path / "demo").exists()


def test_a_malformed_regression_value_names_its_line(tmp_path: Path) -> None:
    paths = _images(tmp_path / "data", 3)
    rows = [{"path": p, "label": v} for p, v in zip(paths, ["0.5", "abc", "1.25"], strict=True)]
    manifest = _write(tmp_path / "data" / "labels.csv", rows)
    with pytest.raises(BuildError, match=r"labels.csv line 3.*abc"):
        build_lmdb(manifest, tmp_path / "out.lmdb", workers=0, progress=False, target_kind="regression")
    assert not (tmp_path / "out.lmdb").exists()
    report = build(manifest, tmp_path / "out.lmdb", workers=0, progress=False, target_kind="regression", on_error="skip")
    assert report.count == 2 and LMDBImageDataset(tmp_path / "out.lmdb").targets == [[0.5], [1.25]]
