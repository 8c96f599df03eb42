"""A map-style dataset as a source (:mod:`lightning_lmdb.sources.dataset`): ``build_lmdb(dataset, target, version=...)``.

Every sample a built database serves is the source's image converted to RGB and its target as the kind serves it; pixel
inputs are stored losslessly in every storage mode; bad samples follow ``on_error``; the database is rebuilt when the
dataset's length or ``version`` changes, and a killed build resumes with the targets of the records it had committed.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from imagegen import read_records
from PIL import Image

from lightning_lmdb.build.readers import find_bad_files
from lightning_lmdb.build.writer import FAULT_ENV, build, build_lmdb
from lightning_lmdb.errors import BuildError, OptionError
from lightning_lmdb.read.dataset import LMDBImageDataset
from lightning_lmdb.sources import base as sources
from lightning_lmdb.sources import dataset as datasource

STORAGES = ["auto", "encoded", "decoded"]


def _pixels(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def _rgb(image: Any) -> np.ndarray:
    """The RGB pixels a database must serve for a source image (a PIL image, a path or the bytes of an image file)."""
    if isinstance(image, (str, os.PathLike)):
        image = Image.open(image)
    elif isinstance(image, bytes):
        image = Image.open(io.BytesIO(image))
    return np.array(image.convert("RGB"))


class PilClasses(torch.utils.data.Dataset):
    """(PIL image of several modes, int class), with torchvision's ``classes`` attribute."""

    classes = ["cat", "dog", "emu"]
    modes = ["RGB", "L", "RGBA", "P", "1"]

    def __init__(self, count: int = 7):
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        rgb = Image.fromarray(_pixels(i, (5 + i, 9, 3)))
        mode = self.modes[i % len(self.modes)]
        image = rgb.quantize(16) if mode == "P" else rgb.convert(mode)
        return image, (2 * i) % 3


class ArrayTags(torch.utils.data.Dataset):
    """(uint8 H x W x C or H x W array, list of tag names): a multi-label target."""

    shapes = [(6, 8, 3), (7, 5), (4, 4, 1), (5, 6, 4), (3, 9, 3)]
    tags = [["sky", "sea"], ["sea"], [], ["tree", "sky"], ["sky"]]

    def __len__(self) -> int:
        return len(self.shapes)

    def __getitem__(self, i: int) -> tuple[np.ndarray, list[str]]:
        return _pixels(10 + i, self.shapes[i]), self.tags[i]


class TensorValues(torch.utils.data.Dataset):
    """``{"image": uint8 C x H x W tensor, "label": float}`` (Hugging Face style): a regression target of one value."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict[str, Any]:
        channels = (3, 1, 3, 4)[i]
        return {"image": torch.from_numpy(_pixels(20 + i, (channels, 6, 5 + i))), "label": 0.25 * i - 0.5, "id": i}


class PathNames(torch.utils.data.Dataset):
    """(path of an image file, class name)."""

    def __init__(self, paths: list[Path], names: list[str]):
        self.paths, self.names = paths, names

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[str, str]:
        return str(self.paths[i]), self.names[i]


class Listed(torch.utils.data.Dataset):
    """Samples given as they are, e.g. (bytes, int), with a ``version`` of the data kept beside."""

    def __init__(self, samples: list[Any]):
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> Any:
        sample = self.samples[i]
        if isinstance(sample, Exception):
            raise sample
        return sample


def _served(path: Path) -> list[tuple[np.ndarray, Any]]:
    dataset = LMDBImageDataset(path, decoder="pil")
    return [(np.array(image), target) for image, target in (dataset[i] for i in range(len(dataset)))]


def _png_files(folder: Path, count: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        path = folder / f"{i}.{'png' if i % 2 else 'jpg'}"
        Image.fromarray(_pixels(30 + i, (7, 6, 3))).save(path)
        paths.append(path)
    return paths


def _contents(path: Path) -> tuple[dict, list[bytes]]:
    meta, values = read_records(path)
    meta.pop("created")
    meta.pop("build_id")
    return meta, values


@pytest.mark.parametrize("storage", STORAGES)
def test_pil_images_with_class_indices_and_the_datasets_classes(tmp_path: Path, storage: str) -> None:
    source = PilClasses()
    target = build_lmdb(source, tmp_path / "out.lmdb", storage=storage, workers=0, progress=False)

    dataset = LMDBImageDataset(target)
    assert dataset.classes == PilClasses.classes
    served = _served(target)
    assert len(served) == len(source)
    for i, (pixels, label) in enumerate(served):
        image, expected = source[i]
        assert np.array_equal(pixels, _rgb(image)), f"sample {i} ({image.mode}) is not stored losslessly with storage={storage}"
        assert type(label) is int and label == expected


@pytest.mark.parametrize("storage", STORAGES)
def test_arrays_with_multi_label_names(tmp_path: Path, storage: str) -> None:
    source = ArrayTags()
    target = build_lmdb(source, tmp_path / "out.lmdb", storage=storage, workers=0, progress=False)

    dataset = LMDBImageDataset(target)
    classes = sorted({tag for tags in ArrayTags.tags for tag in tags})
    assert dataset.classes == classes
    for i, (pixels, label) in enumerate(_served(target)):
        array, tags = source[i]
        expected = Image.fromarray(array[:, :, 0] if array.ndim == 3 and array.shape[2] == 1 else array)
        assert np.array_equal(pixels, _rgb(expected))
        hot = torch.zeros(len(classes), dtype=torch.float32)
        hot[[classes.index(t) for t in tags]] = 1.0
        assert label.dtype == torch.float32 and torch.equal(label, hot)


@pytest.mark.parametrize("storage", STORAGES)
def test_mappings_of_chw_tensors_with_regression_values(tmp_path: Path, storage: str) -> None:
    source = TensorValues()
    target = build_lmdb(source, tmp_path / "out.lmdb", storage=storage, workers=0, progress=False)

    for i, (pixels, value) in enumerate(_served(target)):
        sample = source[i]
        chw = sample["image"].numpy()
        hwc = chw[0] if chw.shape[0] == 1 else chw.transpose(1, 2, 0)
        assert np.array_equal(pixels, _rgb(Image.fromarray(np.ascontiguousarray(hwc))))
        assert value.dtype == torch.float32 and value.shape == (1,) and value.item() == pytest.approx(sample["label"])
    meta, _ = read_records(target)
    assert meta["target_kind"] == "regression" and meta["target_names"] == ["value0"]


def test_a_float_tensor_target_of_k_values(tmp_path: Path) -> None:
    values = [torch.tensor([0.5 * i, -1.0, 3.25], dtype=torch.float32) for i in range(3)]
    source = Listed([(_pixels(i, (4, 4, 3)), values[i]) for i in range(3)])
    target = build_lmdb(source, tmp_path / "out.lmdb", workers=0, progress=False)

    assert [torch.equal(label, values[i]) for i, (_, label) in enumerate(_served(target))] == [True] * 3
    assert read_records(target)[0]["target_names"] == ["value0", "value1", "value2"]


def test_paths_with_class_names(tmp_path: Path) -> None:
    paths = _png_files(tmp_path / "images", 5)
    names = ["owl", "bat", "owl", "cat", "bat"]
    target = build_lmdb(PathNames(paths, names), tmp_path / "out.lmdb", workers=0, progress=False)

    dataset = LMDBImageDataset(target)
    assert dataset.classes == ["bat", "cat", "owl"]
    for i, (pixels, label) in enumerate(_served(target)):
        assert np.array_equal(pixels, _rgb(paths[i]))
        assert dataset.classes[label] == names[i]


def test_encoded_bytes_with_class_indices(tmp_path: Path) -> None:
    paths = _png_files(tmp_path / "images", 4)
    source = Listed([(p.read_bytes(), [3, 0, 1, 3][i]) for i, p in enumerate(paths)])
    target = build_lmdb(source, tmp_path / "out.lmdb", storage="encoded", workers=0, progress=False)

    assert LMDBImageDataset(target).classes == ["0", "1", "2", "3"]
    _, values = read_records(target)
    assert values == [p.read_bytes() for p in paths], "encoded storage keeps the files' own bytes"
    assert [label for _, label in _served(target)] == [3, 0, 1, 3]


def test_hugging_face_label_names_and_a_0d_int_tensor(tmp_path: Path) -> None:
    class Feature:
        names = ["neg", "pos"]

    class HuggingFaceLike(Listed):
        features = {"image": object(), "label": Feature()}

    source = HuggingFaceLike([{"image": Image.fromarray(_pixels(i, (5, 5, 3))), "label": torch.tensor(i % 2)} for i in range(3)])
    target = build_lmdb(source, tmp_path / "out.lmdb", workers=0, progress=False)

    assert LMDBImageDataset(target).classes == ["neg", "pos"]
    assert [label for _, label in _served(target)] == [0, 1, 0]


def test_classes_and_target_kind_options(tmp_path: Path) -> None:
    source = Listed([(_pixels(i, (4, 4, 3)), i % 2) for i in range(4)])
    target = build_lmdb(source, tmp_path / "named.lmdb", classes=["no", "yes"], workers=0, progress=False)
    assert LMDBImageDataset(target).classes == ["no", "yes"]

    target = build_lmdb(source, tmp_path / "values.lmdb", target_kind="regression", workers=0, progress=False)
    assert [label.tolist() for _, label in _served(target)] == [[0.0], [1.0], [0.0], [1.0]]

    with pytest.raises(OptionError, match="label_column"):
        build_lmdb(source, tmp_path / "column.lmdb", label_column="tag", workers=0, progress=False)


def test_workers_read_the_same_database_as_this_process(tmp_path: Path) -> None:
    source = PilClasses(count=12)
    inline = build_lmdb(source, tmp_path / "inline.lmdb", workers=0, commit_every=5, progress=False)
    pooled = build_lmdb(source, tmp_path / "pooled.lmdb", workers=2, commit_every=5, progress=False)

    assert _contents(inline) == _contents(pooled)


def test_rebuilt_when_the_version_or_the_length_changes(tmp_path: Path) -> None:
    target = tmp_path / "out.lmdb"
    assert build(PilClasses(5), target, version=1, workers=0, progress=False).action == "built"
    assert build(PilClasses(5), target, version=1, workers=0, progress=False).action == "up-to-date"
    assert build(PilClasses(5), target, version=2, workers=0, progress=False).action == "built"
    assert build(PilClasses(5), target, version=2, workers=0, progress=False).action == "up-to-date"
    report = build(PilClasses(6), target, version=2, workers=0, progress=False)
    assert report.action == "built" and report.count == 6
    assert build(PilClasses(6), target, version=2, target_kind="regression", workers=0, progress=False).action == "built"


def _bad_samples() -> dict[str, tuple[Any, str]]:
    """A bad sample of each kind, with what its error says."""
    return {
        "float64 array": ((np.zeros((4, 4, 3)), 0), "float64 array; convert it to uint8"),
        "float tensor": ((torch.zeros(3, 4, 4), 0), "torch.float32 tensor; convert it to torch.uint8"),
        "not an image": ((b"these are no image bytes", 0), "not an image"),
        "missing file": (("/nonexistent/x.png", 0), "cannot read its image file"),
        "getitem raises": (KeyError("gone"), "raised KeyError"),
        "target misfit": ((_pixels(0, (4, 4, 3)), 2.5), "is a number, which does not fit a 'class' target"),
        "name among indices": ((_pixels(0, (4, 4, 3)), "three"), "names classes by name, the targets before it by index"),
        "unsupported target": ((_pixels(0, (4, 4, 3)), {"a": 1}), "is a dict"),
    }


@pytest.mark.parametrize("case", list(_bad_samples()))
def test_a_bad_sample_raises_naming_its_index_and_the_records_before_it_stay(tmp_path: Path, case: str) -> None:
    sample, message = _bad_samples()[case]
    samples: list[Any] = [(_pixels(i, (4, 4, 3)), i % 2) for i in range(6)]
    samples[4] = sample
    target = tmp_path / "out.lmdb"

    with pytest.raises(BuildError, match=r"Listed\[4\]") as raised:
        build(Listed(samples), target, workers=0, commit_every=2, progress=False)
    assert message in str(raised.value)

    report = build(Listed(samples), target, workers=0, commit_every=2, progress=False, on_error="skip")
    assert report.action == "resumed" and report.records_written == 1, "the 4 records before it were committed"
    assert [(s.path, message in s.reason) for s in report.skipped] == [("4", True)]
    served = _served(target)
    assert [label for _, label in served] == [0, 1, 0, 1, 1]
    assert np.array_equal(served[4][0], samples[5][0])


def test_find_bad_files_reads_a_dataset(tmp_path: Path) -> None:
    samples: list[Any] = [(_pixels(i, (4, 4, 3)), 0) for i in range(4)]
    samples[2] = (np.zeros((4, 4, 3), dtype=np.float64), 0)
    bad = find_bad_files(sources.scan_source(Listed(samples)), workers=0)
    assert [(b.path, "float64" in b.reason) for b in bad] == [("2", True)]


def test_what_is_a_dataset_source(tmp_path: Path) -> None:
    assert sources.kind_of(Listed([])) is datasource
    assert sources.kind_of([("x.png", 0)]) is datasource
    assert sources.kind_of({"image": 1}) is None
    assert sources.kind_of(tmp_path) is not datasource
    scan = sources.scan_source(PilClasses(3))
    assert [f.relpath for f in scan.files] == ["0", "1", "2"] and scan.targets_from_records
    assert datasource.classes(PilClasses(3)) == (PilClasses.classes, {"cat": 0, "dog": 1, "emu": 2})


DATASET_MODULE = '''
import numpy as np
import torch


class Killable(torch.utils.data.Dataset):
    """Class names: the first three only in the records committed before the kill."""

    def __len__(self):
        return 11

    def __getitem__(self, i):
        pixels = np.random.default_rng(i).integers(0, 256, (5, 4, 3), dtype=np.uint8)
        return pixels, ("zebra" if i < 3 else ("ant", "bee")[i % 2])
'''


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_a_killed_build_resumes_with_the_committed_targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int) -> None:
    (tmp_path / "killable_dataset.py").write_text(DATASET_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    from killable_dataset import Killable

    target = tmp_path / "out.lmdb"
    script = textwrap.dedent(f"""
        from killable_dataset import Killable
        from lightning_lmdb.build.writer import build
        build(Killable(), {str(target)!r}, workers={workers}, commit_every=3, progress=False, version="a")
    """)
    path = os.pathsep.join([str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])
    killed = subprocess.run([sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": path, FAULT_ENV: "commit:2"},
                            start_new_session=True, capture_output=True, timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
    assert not target.exists()

    report = build(Killable(), target, workers=workers, commit_every=3, progress=False, version="a")
    assert report.action == "resumed" and report.records_written == 11 - 6
    reference = build(Killable(), tmp_path / "reference.lmdb", workers=0, commit_every=3, progress=False, version="a")
    assert _contents(target) == _contents(reference.path)
    dataset = LMDBImageDataset(target)
    assert dataset.classes == ["ant", "bee", "zebra"]
    assert [dataset.classes[label] for _, label in _served(target)] == [Killable()[i][1] for i in range(11)]
    sys.modules.pop("killable_dataset", None)
