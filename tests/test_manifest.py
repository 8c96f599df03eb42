"""The manifest source kind: CSV / TSV / JSON Lines files and Hugging Face metadata folders, scanned into a SourceScan."""

from __future__ import annotations

import csv
import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from imagegen import make_folder
from PIL import Image

from lightning_lmdb.errors import OptionError, SourceError
from lightning_lmdb.sources import base as sources
from lightning_lmdb.sources import manifest
from lightning_lmdb.sources.base import NO_TARGET, SourceOptions, SourceScan
from lightning_lmdb.sources.folder import scan_folder

FORMATS = ["csv", "tsv", "jsonl"]


def make_image(path: Path, seed: int = 0) -> Path:
    """A tiny random RGB image, saved as PNG or JPEG by its suffix."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 255, (6 + seed, 5, 3), dtype=np.uint8)).save(path)
    return path


@pytest.fixture
def images(tmp_path: Path) -> Path:
    """A folder of four images (one in a subfolder), PNG and JPEG."""
    for seed, name in enumerate(["a.png", "b.jpg", "sub/c.png", "d.jpg"]):
        make_image(tmp_path / name, seed)
    return tmp_path


def write_manifest(path: Path, rows: list[dict[str, Any]], columns: list[str] | None = None) -> Path:
    """``rows`` as a CSV / TSV (header from ``columns`` or the first row) or JSON Lines file, by ``path``'s suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
        return path
    columns = columns or list(rows[0])
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, delimiter="\t" if path.suffix == ".tsv" else ",")
        writer.writerow(columns)
        writer.writerows([row.get(c, "") for c in columns] for row in rows)
    return path


def scan(path: Path, **options: Any) -> SourceScan:
    return manifest.scan(path, SourceOptions(**options))


def line(fmt: str, row: int) -> int:
    """The physical line of data row ``row`` (0-based) of a manifest written by ``write_manifest``."""
    return row + (1 if fmt == "jsonl" else 2)


def reasons(result: SourceScan) -> dict[str, str]:
    return dict(result.special)


@pytest.mark.parametrize("fmt", FORMATS)
def test_class_names(images: Path, fmt: str):
    rows = [{"path": "d.jpg", "label": "dog", "split": "train"}, {"path": "a.png", "label": "cat", "split": "val"},
            {"path": "sub/c.png", "label": "dog", "split": "train"}, {"path": "./b.jpg", "label": "bird", "split": "test"}]
    result = scan(write_manifest(images / f"labels.{fmt}", rows))
    assert result.root == images.resolve() and result.target_kind == "class"
    assert result.classes == ["bird", "cat", "dog"] and result.class_to_idx == {"bird": 0, "cat": 1, "dog": 2}
    assert [f.relpath for f in result.files] == ["d.jpg", "a.png", "sub/c.png", "b.jpg"]  # the rows' order, normalised
    assert [f.target for f in result.files] == [2, 1, 2, 0]
    assert [f.split for f in result.files] == ["train", "val", "train", "test"] and result.split_names == ["train", "val", "test"]
    assert [f.origin for f in result.files] == [f"labels.{fmt} line {line(fmt, n)}" for n in range(4)]
    for f in result.files:
        st = os.stat(images / f.relpath)
        assert f.path == str(images.resolve() / f.relpath) and (f.size, f.mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert result.special == [] and result.target_names == []
    assert json.loads(result.identity)["manifest"] == f"labels.{fmt}"


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_integer_class_labels(images: Path, fmt: str):
    rows = [{"path": "a.png", "label": 2}, {"path": "b.jpg", "label": 0}]
    result = scan(write_manifest(images / f"m.{fmt}", rows))
    assert result.target_kind == "class" and result.classes == ["0", "1", "2"] and [f.target for f in result.files] == [2, 0]
    named = scan(images / f"m.{fmt}", classes=("x", "y", "z"))
    assert named.classes == ["x", "y", "z"] and named.class_to_idx == {"x": 0, "y": 1, "z": 2}
    assert [f.target for f in named.files] == [2, 0]
    short = scan(images / f"m.{fmt}", classes=("x", "y"))
    assert [f.relpath for f in short.files] == ["b.jpg"]
    assert short.special[0][0] == "a.png" and f"line {line(fmt, 0)}:" in short.special[0][1] and "out of range" in short.special[0][1]


def test_csv_mixed_integers_and_names_are_names(images: Path):
    result = scan(write_manifest(images / "m.csv", [{"path": "a.png", "label": "7"}, {"path": "b.jpg", "label": "cat"}]))
    assert result.classes == ["7", "cat"] and [f.target for f in result.files] == [0, 1]


@pytest.mark.parametrize("fmt", FORMATS)
def test_given_class_list_sets_the_index_order(images: Path, fmt: str):
    rows = [{"path": "a.png", "label": "cat"}, {"path": "b.jpg", "label": "dog"}, {"path": "d.jpg", "label": "dgo"}]
    result = scan(write_manifest(images / f"m.{fmt}", rows), classes=("dog", "cat"))
    assert result.classes == ["dog", "cat"] and result.class_to_idx == {"dog": 0, "cat": 1}
    assert [(f.relpath, f.target) for f in result.files] == [("a.png", 1), ("b.jpg", 0)]
    assert result.special == [("d.jpg", f"m.{fmt} line {line(fmt, 2)}: label 'dgo' is not one of the classes ['dog', 'cat']; "
                                         "fix the label or add the class to classes=")]


def test_csv_numbers_listed_in_classes_are_class_names(images: Path):
    rows = [{"path": "a.png", "label": "7"}, {"path": "b.jpg", "label": "3"}]
    result = scan(write_manifest(images / "m.csv", rows), classes=("3", "7"))
    assert [f.target for f in result.files] == [1, 0] and not result.special
    assert [f.target for f in scan(images / "m.csv").files] == [7, 3], "without a class list they are indices"


def test_csv_class_indices_are_cells_written_as_indices(images: Path, caplog: pytest.LogCaptureFixture):
    # Python's int() reads 1_1 as 11, +1 and 01 as 1, and Arabic-Indic digits: each would merge two labels
    labels = ["1_1", "11", "+1", "1", "\u0663", "3", "01"]
    paths = [f"p{i}.png" for i in range(len(labels))]
    for i, path in enumerate(paths):
        make_image(images / path, i % 3)
    rows = [{"path": p, "label": label} for p, label in zip(paths, labels)]
    with caplog.at_level(logging.WARNING, logger="lightning_lmdb.sources.manifest"):
        result = scan(write_manifest(images / "m.csv", rows))
    assert result.target_kind == "class" and result.classes == sorted(labels) and not result.special
    assert [result.classes[f.target] for f in result.files] == labels, "every cell its own class, named as written"
    assert "is read as class names, not indices" not in caplog.text, "1_1 and \u0663 are names: nothing to warn about"
    rows = [{"path": "a.png", "label": "-1"}, {"path": "b.jpg", "label": "0"}, {"path": "d.jpg", "label": "2"}]
    with caplog.at_level(logging.WARNING, logger="lightning_lmdb.sources.manifest"):
        signed = scan(write_manifest(images / "s.csv", rows))
    assert signed.classes == ["-1", "0", "2"] and [f.target for f in signed.files] == [0, 1, 2]
    assert "'label' is read as class names, not indices: line 2's '-1'" in caplog.text
    indices = scan(write_manifest(images / "i.csv", [{"path": "a.png", "label": "10"}, {"path": "b.jpg", "label": "0"}]))
    assert indices.classes == [str(k) for k in range(11)] and [f.target for f in indices.files] == [10, 0]
    multi = scan(write_manifest(images / "l.csv", [{"path": "a.png", "label": "1|01"}, {"path": "b.jpg", "label": "1_0"}]), label_sep="|")
    assert multi.classes == ["01", "1", "1_0"] and [f.target for f in multi.files] == [(0, 1), (2,)]


def test_csv_class_and_split_cells_are_stripped(images: Path):
    path = images / "m.csv"  # written by hand with a space after each comma
    path.write_text("path, label, split\na.png, cat, train\nb.jpg,cat,val\nd.jpg, dog ,val\n", encoding="utf-8")
    result = scan(path)
    assert result.classes == ["cat", "dog"] and [f.target for f in result.files] == [0, 0, 1]
    assert result.split_names == ["train", "val"] and [f.split for f in result.files] == ["train", "val", "val"]
    path.write_text("path, label\na.png, 3\nb.jpg,3\n", encoding="utf-8")
    assert [f.target for f in scan(path).files] == [3, 3]


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_one_image_written_two_ways_is_listed_twice(images: Path, fmt: str):
    root = images.resolve()
    rows = [{"path": "a.png", "label": "cat"}, {"path": f"{root}/a.png", "label": "dog"}, {"path": f"{root}/./sub/c.png", "label": "dog"},
            {"path": "sub/c.png", "label": "cat"}, {"path": "sub//../b.jpg", "label": "cat"}, {"path": f"{root}/b.jpg", "label": "dog"}]
    result = scan(write_manifest(images / f"m.{fmt}", rows))
    assert [f.relpath for f in result.files] == ["a.png", f"{root}/./sub/c.png", "b.jpg"]
    got = reasons(result)
    assert sorted(got) == sorted([f"{root}/a.png", "sub/c.png", f"{root}/b.jpg"])
    assert f"line {line(fmt, 0)} lists it already" in got[f"{root}/a.png"]
    assert f"line {line(fmt, 2)} lists it already (as {str(root) + '/./sub/c.png'!r})" in got["sub/c.png"]


# ids of their own: a lone surrogate in a test id cannot travel to pytest-xdist's controller (a worker crash)
@pytest.mark.parametrize(("fmt", "path", "why"), [("csv", "a\0b.png", "holds a NUL character"),
                                                  ("jsonl", "a\ud800.png", "is not valid Unicode text")], ids=["nul", "surrogate"])
def test_a_path_that_cannot_be_a_file_name_is_a_row_error(images: Path, fmt: str, path: str, why: str):
    rows = [{"path": "a.png", "label": "cat"}, {"path": path, "label": "dog"}, {"path": "b.jpg", "label": "dog"}]
    result = scan(write_manifest(images / f"m.{fmt}", rows))
    assert [f.relpath for f in result.files] == ["a.png", "b.jpg"]
    assert result.special == [(path, f"m.{fmt} line {line(fmt, 1)}: {path!r} cannot be a file name (it {why}); fix the path")]


def test_a_jsonl_object_split_over_two_lines_is_refused(images: Path):
    path = images / "m.jsonl"  # parsed together, these two lines are two objects: the second with labels from both lines
    path.write_text('{"path": "a.png", "label": ["cat"]}, {"path": "b.jpg", "label": ["dog"\n"bird"]}\n', encoding="utf-8")
    with pytest.raises(SourceError, match=r"m.jsonl' line 1 is not JSON \(Extra data, column 36\): a JSON Lines manifest holds one JSON "
                                          "object per line"):
        scan(path)


def test_a_single_label_in_a_multilabel_column(images: Path):
    rows = [{"path": "a.png", "label": ["cat", "dog"]}, {"path": "b.jpg", "label": "bird"}, {"path": "d.jpg", "label": []}]
    path = write_manifest(images / "m.jsonl", rows)
    with pytest.raises(SourceError) as info:
        scan(path)
    assert ("holds lists of labels and single labels: lists (line 1: ['cat', 'dog']), names (line 2: 'bird'). For a multi-label target set "
            "target_kind='multilabel'") in str(info.value)
    assert "a single label is then a list of one; or write line 2's label as a list: [\"bird\"]." in str(info.value)
    result = scan(path, target_kind="multilabel")
    assert result.classes == ["bird", "cat", "dog"] and [f.target for f in result.files] == [(1, 2), (0,), ()] and not result.special


@pytest.mark.parametrize("fmt", FORMATS)
def test_multilabel(images: Path, fmt: str):
    if fmt == "jsonl":
        labels: list[Any] = [["dog", "cat", "dog"], [], ["bird"]]
        options: dict[str, Any] = {}
    else:
        labels, options = ["dog|cat|dog", "", " bird "], {"label_sep": "|"}
    rows = [{"path": p, "label": label} for p, label in zip(["a.png", "b.jpg", "d.jpg"], labels)]
    result = scan(write_manifest(images / f"m.{fmt}", rows), **options)
    assert result.target_kind == "multilabel" and result.classes == ["bird", "cat", "dog"]
    assert [f.target for f in result.files] == [(1, 2), (), (0,)]
    given = scan(images / f"m.{fmt}", target_kind="multilabel", classes=("dog", "cat", "bird", "fish"), **options)
    assert given.classes == ["dog", "cat", "bird", "fish"] and [f.target for f in given.files] == [(0, 1), (), (2,)]


def test_multilabel_indices(images: Path):
    result = scan(write_manifest(images / "m.jsonl", [{"path": "a.png", "label": [3, 1]}, {"path": "b.jpg", "label": [0]}]))
    assert result.classes == ["0", "1", "2", "3"] and [f.target for f in result.files] == [(1, 3), (0,)]
    csv_result = scan(write_manifest(images / "m.csv", [{"path": "a.png", "label": "3;1"}]), label_sep=";")
    assert csv_result.classes == ["0", "1", "2", "3"] and csv_result.files[0].target == (1, 3)


@pytest.mark.parametrize("fmt", FORMATS)
def test_regression_columns(images: Path, fmt: str):
    rows = [{"path": "a.png", "x": 0.5, "y": -2, "split": "train"}, {"path": "b.jpg", "x": 1.25, "y": 3, "split": "val"}]
    result = scan(write_manifest(images / f"m.{fmt}", rows), label_column=("x", "y"))
    assert result.target_kind == "regression" and result.target_names == ["x", "y"]
    assert result.classes == [] and result.class_to_idx == {}
    assert [f.target for f in result.files] == [(0.5, -2.0), (1.25, 3.0)]
    assert all(isinstance(v, float) for f in result.files for v in f.target)
    assert [f.split for f in result.files] == ["train", "val"]
    assert scan(images / f"m.{fmt}", label_column="x,y").target_names == ["x", "y"]  # the comma-separated spelling


@pytest.mark.parametrize("fmt", FORMATS)
def test_regression_one_column_is_inferred_from_fractions(images: Path, fmt: str):
    rows = [{"path": "a.png", "label": 0.5}, {"path": "b.jpg", "label": 2}]
    result = scan(write_manifest(images / f"m.{fmt}", rows))
    assert result.target_kind == "regression" and result.target_names == ["label"]
    assert [f.target for f in result.files] == [(0.5,), (2.0,)]


def test_regression_list_column(images: Path):
    rows = [{"path": "a.png", "box": [0.5, 1, 2.5]}, {"path": "b.jpg", "box": [1.5, 2, 3]}, {"path": "d.jpg", "box": [1.5, 2]},
            {"path": "sub/c.png", "box": [0.5, float("nan"), 1.0]}]
    path = images / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))  # json.dumps writes NaN
    result = scan(path, label_column="box")
    assert result.target_kind == "regression" and result.target_names == ["box[0]", "box[1]", "box[2]"]
    assert [f.target for f in result.files] == [(0.5, 1.0, 2.5), (1.5, 2.0, 3.0)]
    got = reasons(result)
    assert "m.jsonl line 3" in got["d.jpg"] and "2 numbers" in got["d.jpg"]
    assert "m.jsonl line 4" in got["sub/c.png"] and "not a finite number" in got["sub/c.png"]


def test_regression_row_errors(images: Path):
    rows = [{"path": "a.png", "x": "1.5", "y": "2"}, {"path": "b.jpg", "x": "", "y": "2"}, {"path": "d.jpg", "x": "abc", "y": "1"},
            {"path": "sub/c.png", "x": "inf", "y": "1"}]
    result = scan(write_manifest(images / "m.csv", rows), label_column=["x", "y"], target_kind="regression")
    assert [f.relpath for f in result.files] == ["a.png"]
    got = reasons(result)
    assert got["b.jpg"].startswith("m.csv line 3: empty label") and "'x'" in got["b.jpg"]
    assert got["d.jpg"].startswith("m.csv line 4: malformed label 'abc'")
    assert got["sub/c.png"].startswith("m.csv line 5:") and "finite" in got["sub/c.png"]
    boolean = scan(write_manifest(images / "b.jsonl", [{"path": "a.png", "label": 0.5}, {"path": "b.jpg", "label": True}]))
    assert boolean.target_kind == "regression" and "b.jsonl line 2: malformed label True" in reasons(boolean)["b.jpg"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_label_column(images: Path, fmt: str):
    result = scan(write_manifest(images / f"m.{fmt}", [{"path": "a.png", "note": "x"}, {"path": "b.jpg", "note": "y"}]))
    assert result.target_kind == "none" and result.classes == [] and result.class_to_idx == {}
    assert [f.target for f in result.files] == [NO_TARGET, NO_TARGET]
    ignored = scan(write_manifest(images / f"l.{fmt}", [{"path": "a.png", "label": "cat"}]), target_kind="none")
    assert ignored.target_kind == "none" and ignored.files[0].target == NO_TARGET


def test_csv_with_byte_order_mark_and_crlf(images: Path):
    path = images / "excel.csv"
    path.write_bytes("\ufeffpath,label\r\na.png,cat\r\n,,\r\n\r\nb.jpg,dog\r\n".encode())
    result = scan(path)
    assert [(f.relpath, f.target, f.origin) for f in result.files] == [("a.png", 0, "excel.csv line 2"), ("b.jpg", 1, "excel.csv line 5")]


def test_ndjson_and_upper_case_suffix(images: Path):
    for name in ("m.ndjson", "M.CSV"):
        path = write_manifest(images / name, [{"path": "a.png", "label": "cat"}], ["path", "label"])
        assert manifest.accepts(path) and scan(path).classes == ["cat"]


@pytest.mark.parametrize("name", ["metadata.csv", "metadata.jsonl"])
def test_hugging_face_folder(images: Path, name: str):
    write_manifest(images / name, [{"file_name": "sub/c.png", "label": "b"}, {"file_name": "a.png", "label": "a"}])
    assert manifest.accepts(images) and manifest.has_samples(images, SourceOptions())
    result = scan(images)
    assert result.root == images.resolve() and result.classes == ["a", "b"]
    fmt = name.split(".")[1]
    assert [(f.relpath, f.target, f.origin) for f in result.files] == [("sub/c.png", 1, f"{name} line {line(fmt, 0)}"),
                                                                       ("a.png", 0, f"{name} line {line(fmt, 1)}")]
    assert manifest.classes(images, SourceOptions()) == (["a", "b"], {"a": 0, "b": 1})


def test_metadata_wins_over_class_subfolders(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    folder = make_folder(tmp_path / "src", classes=("cat", "dog"), per_class=2)
    relpaths = [f.relpath for f in scan_folder(folder).files]
    write_manifest(folder / "metadata.csv", [{"file_name": p, "label": "pet"} for p in relpaths])
    assert sources.kind_of(folder) is manifest
    with caplog.at_level(logging.INFO, logger="lightning_lmdb.sources.manifest"):
        result = sources.scan_source(folder)
    assert result.classes == ["pet"] and [f.relpath for f in result.files] == relpaths
    assert "metadata.csv" in caplog.text and "subfolders" in caplog.text


def test_both_metadata_files_are_refused(images: Path):
    write_manifest(images / "metadata.csv", [{"file_name": "a.png"}])
    write_manifest(images / "metadata.jsonl", [{"file_name": "a.png"}])
    with pytest.raises(SourceError, match="metadata.csv and metadata.jsonl.*keep one"):
        scan(images)


def test_root_option_and_absolute_paths(images: Path, tmp_path: Path):
    elsewhere = make_image(tmp_path / "other" / "e.png", 3)
    path = write_manifest(tmp_path / "lists" / "m.csv", [{"path": "a.png", "label": "x"}, {"path": str(elsewhere), "label": "y"}])
    result = scan(path, root=str(images))
    assert result.root == images.resolve()
    assert [(f.relpath, f.path) for f in result.files] == [("a.png", str(images.resolve() / "a.png")), (str(elsewhere), str(elsewhere))]
    assert result.files[1].size == elsewhere.stat().st_size
    with pytest.raises(SourceError, match="root="):
        scan(path, root=str(tmp_path / "missing"))


def test_row_errors(images: Path):
    rows = [
        {"path": "a.png", "label": "cat", "split": "train"},   # line 2: fine
        {"path": "b.jpg", "label": "", "split": "train"},      # line 3: empty label
        {"path": "../x.png", "label": "cat", "split": "val"},  # line 4: out of the root
        {"path": "", "label": "cat", "split": "val"},          # line 5: empty image cell
        {"path": "./a.png", "label": "dog", "split": "val"},   # line 6: a.png again
        {"path": "d.jpg", "label": "dog", "split": ""},        # line 7: empty split
        {"path": "sub/../sub/c.png", "label": "dog", "split": "val"},  # line 8: fine (normalised)
        {"path": "missing.png", "label": "dog", "split": "val"},  # line 9: missing image: kept
    ]
    path = write_manifest(images / "labels.csv", rows)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write("extra.png,dog,val,surplus\n")  # line 10: too many cells
    result = scan(path)
    assert [f.relpath for f in result.files] == ["a.png", "sub/c.png", "missing.png"]
    missing = result.files[2]
    assert (missing.size, missing.mtime_ns, missing.origin) == (0, 0, "labels.csv line 9")
    assert [relpath for relpath, _ in result.special] == ["b.jpg", "../x.png", "", "a.png", "d.jpg", "extra.png"]
    lines = [int(reason.split(" line ")[1].split(":")[0]) for _, reason in result.special]
    assert lines == [3, 4, 5, 6, 7, 10]
    assert all(reason.startswith("labels.csv line ") for _, reason in result.special)
    got = reasons(result)
    assert "empty label" in got["b.jpg"] and "leads out of the root" in got["../x.png"] and "empty image cell" in got[""]
    assert "listed twice" in got["a.png"] and "line 2" in got["a.png"]
    assert "empty split" in got["d.jpg"] and "4 cells, the header has 3" in got["extra.png"]


def test_jsonl_row_errors(images: Path):
    rows = [{"path": "a.png", "label": "cat"}, {"path": "b.jpg", "label": {"name": "cat"}}, {"path": 5, "label": "cat"},
            {"path": "d.jpg"}, {"path": "sub/c.png", "label": False}]
    result = scan(write_manifest(images / "m.jsonl", rows))
    assert result.target_kind == "class" and [f.relpath for f in result.files] == ["a.png"]
    got = reasons(result)
    assert got["b.jpg"].startswith("m.jsonl line 2: malformed label") and got["5"].startswith("m.jsonl line 3: image path 5")
    assert got["d.jpg"] == "m.jsonl line 4: empty label" and got["sub/c.png"].startswith("m.jsonl line 5: malformed label False")


def test_equal_values_of_other_types_are_told_apart(images: Path):
    rows = [{"path": "a.png", "label": 1}, {"path": "b.jpg", "label": True}, {"path": "d.jpg", "label": 1.0},
            {"path": "sub/c.png", "label": 1}]
    result = scan(write_manifest(images / "m.jsonl", rows), target_kind="class")
    assert [(f.relpath, f.target) for f in result.files] == [("a.png", 1), ("sub/c.png", 1)]
    assert sorted(reasons(result)) == ["b.jpg", "d.jpg"]
    multi = [{"path": "a.png", "label": [1]}, {"path": "b.jpg", "label": [True]}, {"path": "d.jpg", "label": [1]}]
    result = scan(write_manifest(images / "l.jsonl", multi))
    assert [(f.relpath, f.target) for f in result.files] == [("a.png", (1,)), ("d.jpg", (1,))] and list(reasons(result)) == ["b.jpg"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_is_special_and_never_opened(images: Path):
    os.mkfifo(images / "pipe.png")
    result = scan(write_manifest(images / "m.csv", [{"path": "a.png"}, {"path": "pipe.png"}]))
    assert [f.relpath for f in result.files] == ["a.png"]
    assert result.special[0][0] == "pipe.png" and result.special[0][1].startswith("m.csv line 3: 'pipe.png' is a FIFO")


def test_file_level_errors(images: Path):
    def refused(name: str, content: str | bytes, *patterns: str, **options: Any) -> None:
        path = images / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        with pytest.raises(SourceError) as info:
            scan(path, **options)
        for pattern in (name, *patterns):
            assert pattern in str(info.value), (pattern, str(info.value))

    refused("latin.csv", "path,label\na.png,cat\nb.jpg,ni\xf1o\n".encode("latin-1"), "line 3", "UTF-8")
    refused("bad.jsonl", '{"path": "a.png"}\n\n{"path": oops}\n', "line 3", "not JSON")
    refused("array.jsonl", '{"path": "a.png"}\n["b.jpg"]\n', "line 2", "not an object")
    refused("empty.csv", "", "header")
    refused("header.csv", "path,label\n", "no data rows")
    refused("blank.jsonl", "\n\n", "no data rows")
    refused("noimage.csv", "image,label\na.png,cat\n", "no image column", "['image', 'label']", "path_column=")
    refused("column.csv", "path,label\na.png,cat\n", "'img'", "path_column='img'", "['path', 'label']", path_column="img")
    refused("labels.csv", "path,label\na.png,cat\n", "'tag'", "['path', 'label']", label_column="tag")
    refused("split.csv", "path,label\na.png,cat\n", "'fold'", split_column="fold")
    refused("twice.csv", "path,label,label\na.png,cat,dog\n", "'label'")
    refused("mixed.jsonl", '{"path": "a.png", "label": "cat"}\n{"path": "b.jpg", "label": 1}\n', "line 1", "line 2", "names")
    refused("nolabel.csv", "path\na.png\n", "target_kind='class'", "label_column=", target_kind="class")
    refused("huge.csv", "path,label\na.png,cat\nb.jpg," + "x" * 200_000 + "\n", "line 3", "field limit")


@pytest.mark.parametrize("content", [
    "path,label\na.png,cat\nb.jpg,0.5\n",  # names and fractions
    '{"path": "a.png", "label": 1.0}\n{"path": "b.jpg", "label": 2.0}\n',  # whole-number floats
    '{"path": "a.png", "label": 1}\n{"path": "b.jpg", "label": [1]}\n',  # integers and lists
    "path,label\na.png,\n",  # no values
    '{"path": "a.png", "label": [1.0, 2.0]}\n{"path": "b.jpg", "label": [0, 1]}\n',  # lists of whole-number floats
])
def test_unclear_target_kind_asks_for_target_kind(images: Path, content: str):
    path = images / ("m.jsonl" if content.startswith("{") else "m.csv")
    path.write_text(content)
    with pytest.raises(SourceError, match="target_kind=") as info:
        scan(path)
    assert "--target-kind" in str(info.value) and "data.source_options.target_kind" in str(info.value) and path.name in str(info.value)


def test_unclear_kind_resolved_by_target_kind(images: Path):
    path = images / "m.jsonl"
    path.write_text('{"path": "a.png", "label": 1.0}\n{"path": "b.jpg", "label": 2.0}\n')
    assert [f.target for f in scan(path, target_kind="regression").files] == [(1.0,), (2.0,)]


def test_conflicting_options(images: Path):
    path = write_manifest(images / "m.csv", [{"path": "a.png", "label": "0.5"}])
    with pytest.raises(OptionError, match="label_sep"):
        scan(path, target_kind="class", label_sep="|")
    with pytest.raises(OptionError, match="label_sep="):
        scan(path, target_kind="multilabel")
    with pytest.raises(OptionError, match="classes="):
        scan(path, target_kind="regression", classes=("a",))
    with pytest.raises(OptionError, match="label_sep="):
        scan(write_manifest(images / "nolabel.csv", [{"path": "a.png"}]), label_sep="|")
    with pytest.raises(OptionError, match="regression"):
        scan(write_manifest(images / "two.csv", [{"path": "a.png", "x": "1", "y": "2"}]), label_column=("x", "y"), target_kind="class")


def test_fingerprint_follows_labels_and_classes(images: Path):
    path = write_manifest(images / "m.csv", [{"path": "a.png", "label": "cat"}, {"path": "b.jpg", "label": "dog"}])
    before = scan(path).fingerprint()
    assert scan(path).fingerprint() == before
    assert scan(path, classes=("dog", "cat")).fingerprint() != before  # same names, other indices
    assert scan(path, classes=("cat", "dog", "eel")).fingerprint() != before  # same indices, other classes
    write_manifest(path, [{"path": "a.png", "label": "cat"}, {"path": "b.jpg", "label": "eel"}])
    relabelled = scan(path)
    assert [f.target for f in relabelled.files] == [0, 1] and relabelled.fingerprint() != before  # same indices, other names
    write_manifest(path, [{"path": "a.png", "label": "dog"}, {"path": "b.jpg", "label": "dog"}])
    assert scan(path).fingerprint() != before


def test_accepts(images: Path):
    for name in ("list.txt", "data.json", "labels.csv.bak", "a.parquet"):
        (images / name).write_text("path,label\na.png,cat\n")
        assert not manifest.accepts(images / name)
    assert not manifest.accepts(images / "a.png") and not manifest.accepts(images / "missing.csv")
    assert not manifest.accepts(str(images / "list.txt")) and not manifest.accepts(object())
    assert not manifest.accepts(images)  # a folder without metadata
    (images / "dir.csv").mkdir()
    assert not manifest.accepts(images / "dir.csv")
    write_manifest(images / "x.tsv", [{"path": "a.png"}])
    assert manifest.accepts(images / "x.tsv")


def test_has_samples_and_classes(images: Path):
    header_only = images / "h.csv"
    header_only.write_text("path,label\n\n,,\n")
    assert not manifest.has_samples(header_only, SourceOptions())
    path = write_manifest(images / "m.csv", [{"path": "nowhere.png", "label": "b"}, {"path": "a.png", "label": "a"}])
    assert manifest.has_samples(path, SourceOptions())
    assert manifest.classes(path, SourceOptions()) == (["a", "b"], {"a": 0, "b": 1})
    empty_jsonl = images / "e.jsonl"
    empty_jsonl.write_text("\n  \n")
    assert not manifest.has_samples(empty_jsonl, SourceOptions())


def test_same_scan_as_image_folder(tmp_path: Path):
    folder = make_folder(tmp_path / "src")
    expected = scan_folder(folder)
    rows = [{"path": f.relpath, "label": f.relpath.split("/")[0]} for f in expected.files]
    result = scan(write_manifest(tmp_path / "train.csv", rows), root=str(folder))
    assert result.classes == expected.classes and result.class_to_idx == expected.class_to_idx
    assert [(f.relpath, f.path, f.target, f.size, f.mtime_ns) for f in result.files] == \
        [(f.relpath, f.path, f.target, f.size, f.mtime_ns) for f in expected.files]


def test_scan_source_dispatches_to_manifests(images: Path):
    path = write_manifest(images / "m.csv", [{"path": "a.png", "tag": "x|y"}])
    assert sources.kind_of(path) is manifest
    result = sources.scan_source(str(path), SourceOptions(label_column="tag", label_sep="|"))
    assert result.target_kind == "multilabel" and result.classes == ["x", "y"] and result.files[0].target == (0, 1)
    assert sources.scan_source(path).classes == []  # default options: no 'label' column
