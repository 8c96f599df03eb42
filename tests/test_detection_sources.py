"""Detection input formats (issue 32): COCO JSON, YOLO, Pascal VOC and a JSON Lines manifest of one hand-written scene set give
the same boxes, labels and class order; every bad input names its file and place; the box rules (degenerate dropped, a
pixel of edge clipped, more refused); splits; EXIF orientation counted.

These test the scans (lightning_lmdb.sources), and each format built into a database and served (through
``LMDBImageDataset`` and the raw dataset); the ``boxes`` target kind itself (storage, geometry) is tests/test_boxes.py.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import tv_tensors

from lightning_lmdb.build.writer import build_lmdb
from lightning_lmdb.errors import BuildError, OptionError, SourceError
from lightning_lmdb.read.dataset import LMDBImageDataset
from lightning_lmdb.read.raw import RawImageDataset
from lightning_lmdb.sources.base import SourceOptions, kind_name, kind_of, labels_of, scan_source
from lightning_lmdb.sources.yolo import parse_yaml
from lightning_lmdb.targets.boxes import Boxes
from lightning_lmdb.tools import cli

CLASSES = ["cat", "dog", "person"]
CATEGORY_IDS = [1, 3, 7]  # not contiguous; in id order they are the sorted names
# The scene set: per image its size, its split and its boxes (XYXY pixels, integers so VOC's 1-based form is exact) with class names.
SCENES: dict[str, tuple[tuple[int, int], str, list[tuple[tuple[int, int, int, int], str]]]] = {
    "a": ((64, 48), "train", [((10, 5, 30, 25), "cat"), ((0, 0, 64, 48), "person")]),
    "b": ((80, 60), "train", [((40, 10, 70, 50), "dog"), ((2, 3, 12, 9), "cat"), ((20, 20, 28, 44), "dog")]),
    "c": ((50, 50), "val", []),  # a negative
}


def _image(path: Path, size: tuple[int, int], orientation: int = 1) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(len(path.name)).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    if orientation != 1:
        exif = Image.Exif()
        exif[0x0112] = orientation
        image.save(path.with_suffix(".jpg") if path.suffix != ".jpg" else path, exif=exif)
    else:
        image.save(path)


def write_coco(folder: Path, scenes: dict = SCENES, name: str = "instances_train.json", extra: dict | None = None) -> Path:
    images, annotations, aid = [], [], 100
    for iid, (stem, (size, _, boxes)) in enumerate(scenes.items(), 1):
        _image(folder / "images" / f"{stem}.png", size)
        images.append({"id": iid, "file_name": f"{stem}.png", "width": size[0], "height": size[1]})
        for (x1, y1, x2, y2), cls in boxes:
            aid += 1
            annotations.append({"id": aid, "image_id": iid, "category_id": CATEGORY_IDS[CLASSES.index(cls)],
                                "bbox": [x1, y1, x2 - x1, y2 - y1], "area": float((x2 - x1) * (y2 - y1)), "iscrowd": 0, "segmentation": []})
    categories = [{"id": cid, "name": cls} for cid, cls in reversed(list(zip(CATEGORY_IDS, CLASSES)))]  # any order in the file
    data = {"info": {}, "images": images, "annotations": annotations, "categories": categories, **(extra or {})}
    path = folder / name
    path.write_text(json.dumps(data))
    return path


def write_yolo(folder: Path, scenes: dict = SCENES, names: str = "names: [cat, dog, person]") -> Path:
    for stem, (size, split, boxes) in scenes.items():
        _image(folder / "images" / split / f"{stem}.png", size)
        if boxes:
            w, h = size
            lines = [f"{CLASSES.index(cls)} {(x1 + x2) / 2 / w:.9f} {(y1 + y2) / 2 / h:.9f} {(x2 - x1) / w:.9f} {(y2 - y1) / h:.9f}"
                     for (x1, y1, x2, y2), cls in boxes]
            label = folder / "labels" / split / f"{stem}.txt"
            label.parent.mkdir(parents=True, exist_ok=True)
            label.write_text("\n".join(lines) + "\n")
    (folder / "labels").mkdir(exist_ok=True)
    (folder / "data.yaml").write_text(f"# a dataset\npath: .\ntrain: images/train\nval: images/val  # the val split\n{names}\n")
    return folder


def _voc_xml(filename: str, size: tuple[int, int], objects: str) -> str:
    return (f"<annotation><folder>VOC</folder><filename>{filename}</filename><size><width>{size[0]}</width><height>{size[1]}</height>"
            f"<depth>3</depth></size>{objects}</annotation>")


def _voc_object(name: str, box: tuple[int, int, int, int], difficult: int = 0) -> str:
    x1, y1, x2, y2 = box
    return (f"<object><name>{name}</name><difficult>{difficult}</difficult><bndbox><xmin>{x1 + 1}</xmin><ymin>{y1 + 1}</ymin>"
            f"<xmax>{x2}</xmax><ymax>{y2}</ymax></bndbox></object>")


def write_voc(folder: Path, scenes: dict = SCENES) -> Path:
    (folder / "Annotations").mkdir(parents=True)
    splits: dict[str, list[str]] = {}
    for stem, (size, split, boxes) in scenes.items():
        _image(folder / "JPEGImages" / f"{stem}.png", size)
        objects = "".join(_voc_object(cls, box) for box, cls in boxes)
        (folder / "Annotations" / f"{stem}.xml").write_text(_voc_xml(f"{stem}.png", size, objects))
        splits.setdefault(split, []).append(stem)
    (folder / "ImageSets" / "Main").mkdir(parents=True)
    for split, stems in splits.items():
        (folder / "ImageSets" / "Main" / f"{split}.txt").write_text("\n".join(stems) + "\n")
    return folder


def write_jsonl(folder: Path, scenes: dict = SCENES) -> Path:
    rows = []
    for stem, (size, split, boxes) in scenes.items():
        _image(folder / "images" / f"{stem}.png", size)
        rows.append({"path": f"images/{stem}.png", "boxes": [list(b) for b, _ in boxes], "labels": [c for _, c in boxes], "split": split})
    path = folder / "boxes.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _by_stem(scan) -> dict[str, tuple[np.ndarray, list[int]]]:
    return {Path(f.relpath).stem: (np.asarray(f.target.boxes, dtype=np.float32).reshape(-1, 4), list(f.target.labels)) for f in scan.files}


def _expected() -> dict[str, tuple[np.ndarray, list[int]]]:
    return {stem: (np.asarray([b for b, _ in boxes], dtype=np.float32).reshape(-1, 4), [CLASSES.index(c) for _, c in boxes])
            for stem, (_, _, boxes) in SCENES.items()}


@pytest.fixture
def formats(tmp_path: Path) -> dict[str, Path]:
    return {"coco": write_coco(tmp_path / "coco"), "yolo": write_yolo(tmp_path / "yolo"), "voc": write_voc(tmp_path / "voc"),
            "manifest": write_jsonl(tmp_path / "jsonl")}


# --- one scene set, four formats ---------------------------------------------------------------------------------------------


def test_four_formats_give_the_same_boxes_labels_and_classes(formats: dict[str, Path]) -> None:
    expected = _expected()
    for kind, source in formats.items():
        assert kind_name(kind_of(source)) == kind, source
        assert kind_of(source).has_samples(source, SourceOptions()) and kind_of(source).classes(source, SourceOptions())[0] == CLASSES
        scan = scan_source(source)
        assert scan.target_kind == "boxes" and scan.classes == CLASSES, kind
        assert scan.class_to_idx == {c: k for k, c in enumerate(CLASSES)}
        assert scan.special == [], (kind, scan.special)
        found = _by_stem(scan)
        assert sorted(found) == sorted(expected), kind
        for stem, (boxes, labels) in expected.items():
            np.testing.assert_allclose(found[stem][0], boxes, rtol=0, atol=1e-4, err_msg=f"{kind} {stem}")
            assert found[stem][1] == labels, (kind, stem)
        assert all(isinstance(f.target, Boxes) for f in scan.files)
        assert scan.target_meta["degenerate_dropped"] == 0 and scan.target_meta["exif_rotated"] == 0
        assert labels_of(source).classes == CLASSES and labels_of(source).target_kind == "boxes"
        assert scan.identity


def test_four_formats_serve_the_same_boxes_through_the_database_and_the_files(formats: dict[str, Path], tmp_path: Path) -> None:
    expected = _expected()
    for kind, source in formats.items():
        database = build_lmdb(source, tmp_path / f"{kind}.lmdb", workers=0, progress=False)
        scan = scan_source(source)
        for dataset in (LMDBImageDataset(database), RawImageDataset.from_scan(scan)):
            assert dataset.classes == CLASSES, (kind, type(dataset).__name__)
            for i, path in enumerate(dataset.paths):
                image, target = dataset[i]
                boxes, labels = expected[Path(path).stem]
                where = f"{kind} {type(dataset).__name__} {path}"
                assert isinstance(target["boxes"], tv_tensors.BoundingBoxes) and target["boxes"].format == tv_tensors.BoundingBoxFormat.XYXY
                assert tuple(target["boxes"].canvas_size) == (image.height, image.width), where
                np.testing.assert_allclose(target["boxes"].numpy(), boxes, rtol=0, atol=1e-4, err_msg=where)
                assert target["labels"].dtype == torch.int64 and target["labels"].tolist() == labels, where


@pytest.mark.parametrize("fmt", ["coco", "yolo", "voc", "manifest"])
def test_a_bad_annotation_stops_the_build_naming_its_file_and_place_and_leaves_no_database(
        fmt: str, formats: dict[str, Path], tmp_path: Path) -> None:
    source = formats[fmt]
    if fmt == "coco":
        data = json.loads(source.read_text())
        data["annotations"][0]["category_id"] = 99
        source.write_text(json.dumps(data))
        said = r"instances_train\.json.*annotation id 101.*category_id 99"
    elif fmt == "yolo":
        (source / "labels" / "train" / "a.txt").write_text("0 0.5 0.5 0.2\n")
        said = r"labels/train/a\.txt line 1 has 4 fields"
    elif fmt == "voc":
        (source / "Annotations" / "b.xml").write_text("<annotation><filename>b.png</filename></annotation>")
        said = r"b\.xml.*size"
    else:
        source.write_text(source.read_text().replace("[10, 5, 30, 25]", "[10, 5, 300, 25]"))
        said = r"boxes\.jsonl line 1.*"
    target = tmp_path / f"{fmt}.lmdb"
    with pytest.raises(BuildError, match=said):
        build_lmdb(source, target, workers=0, progress=False)
    assert not target.exists(), "a refused build leaves no database (only its resumable .partial, as every refused build)"


def test_a_box_moved_by_a_pixel_differs(tmp_path: Path) -> None:
    moved = {**SCENES, "a": (SCENES["a"][0], "train", [((11, 5, 30, 25), "cat"), ((0, 0, 64, 48), "person")])}
    found = _by_stem(scan_source(write_voc(tmp_path / "voc", moved)))
    assert not np.allclose(found["a"][0], _expected()["a"][0], atol=0.5)


def test_coco_keeps_its_ids_crowd_and_area(formats: dict[str, Path]) -> None:
    scan = scan_source(formats["coco"])
    assert scan.target_meta["category_ids"] == CATEGORY_IDS and scan.target_meta["format"] == "coco"
    b = next(f.target for f in scan.files if f.relpath == "b.png")
    assert b.image_id == 2 and b.category_ids == (3, 1, 3) and b.iscrowd == (0, 0, 0) and b.area == (1200.0, 60.0, 192.0)
    assert b.labels == (1, 0, 1)
    c = next(f.target for f in scan.files if f.relpath == "c.png")
    assert len(c) == 0 and c.image_id == 3  # an image without annotations is kept
    assert scan.files[0].origin == "instances_train.json image id 1"


def test_voc_keeps_difficult(tmp_path: Path) -> None:
    folder = write_voc(tmp_path / "voc")
    objects = _voc_object("cat", (10, 5, 30, 25), difficult=1) + _voc_object("person", (0, 0, 64, 48))
    (folder / "Annotations" / "a.xml").write_text(_voc_xml("a.png", (64, 48), objects))
    a = next(f.target for f in scan_source(folder).files if f.relpath == "JPEGImages/a.png")
    assert a.difficult == (1, 0) and a.boxes[0] == (10.0, 5.0, 30.0, 25.0)


def test_an_edited_annotation_changes_the_fingerprint(formats: dict[str, Path]) -> None:
    for kind in ("coco", "yolo", "voc", "manifest"):
        before = scan_source(formats[kind]).fingerprint()
        source = formats[kind]
        if kind == "coco":
            data = json.loads(source.read_text())
            data["annotations"][0]["area"] = 1.0
            source.write_text(json.dumps(data))
        elif kind == "yolo":
            (source / "labels" / "train" / "a.txt").write_text("0 0.5 0.5 0.25 0.25\n")
        elif kind == "voc":
            (source / "Annotations" / "c.xml").write_text(_voc_xml("c.png", (50, 50), _voc_object("dog", (1, 1, 5, 5))))
        else:
            source.write_text(source.read_text().replace('"split": "val"', '"split": "test"'))
        assert scan_source(source).fingerprint() != before, kind


def test_classes_option_maps_through_given_classes(formats: dict[str, Path]) -> None:
    given = ("person", "zebra", "cat", "dog")
    for kind, source in formats.items():
        scan = scan_source(source, SourceOptions(classes=given))
        assert scan.classes == list(given), kind
        a = next(f.target for f in scan.files if Path(f.relpath).stem == "a")
        assert a.labels == (2, 0), kind
    assert scan_source(formats["coco"], SourceOptions(classes=given)).target_meta["category_ids"] == [7, None, 1, 3]
    with pytest.raises(SourceError, match="'dog'.*not among"):
        scan_source(formats["voc"], SourceOptions(classes=("cat", "person")))


# --- splits ------------------------------------------------------------------------------------------------------------------


def test_splits_of_each_format(formats: dict[str, Path], tmp_path: Path) -> None:
    want = {stem: split for stem, (_, split, _) in SCENES.items()}
    for kind in ("yolo", "voc", "manifest"):
        scan = scan_source(formats[kind])
        assert {Path(f.relpath).stem: f.split for f in scan.files} == want, kind
        assert scan.split_names == ["train", "val"], kind
    # YOLO: the data.yaml itself as the source
    scan = scan_source(formats["yolo"] / "data.yaml")
    assert {Path(f.relpath).stem: f.split for f in scan.files} == want and scan.root == formats["yolo"].resolve()
    # COCO: one JSON per split, each its own source without a split
    val = write_coco(tmp_path / "coco", {"c": SCENES["c"]}, name="instances_val.json")
    assert [f.relpath for f in scan_source(val).files] == ["c.png"] and scan_source(val).split_names == []
    # VOC without ImageSets: every XML, no split; with them an unlisted XML is counted, not a sample
    voc = formats["voc"]
    (voc / "ImageSets" / "Main" / "val.txt").unlink()
    scan = scan_source(voc)
    assert [f.relpath for f in scan.files] == ["JPEGImages/a.png", "JPEGImages/b.png"] and scan.target_meta["unlisted"] == 1


def test_voc_id_in_two_splits_is_named(formats: dict[str, Path]) -> None:
    (formats["voc"] / "ImageSets" / "Main" / "val.txt").write_text("c\na\n")
    scan = scan_source(formats["voc"])
    assert any("val.txt line 2" in reason and "'a'" in reason and "train.txt" in reason for _, reason in scan.special)


def test_yaml_reader() -> None:
    found = parse_yaml("path: ../data  # root\ntrain: 'images/train'\nnames:\n  0: cat\n  1: 'hot dog'\nnc: 2\n")
    assert found == {"path": "../data", "train": "images/train", "names": {0: "cat", 1: "hot dog"}, "nc": 2}
    assert parse_yaml('names: ["a", b, "c, d"]')["names"] == ["a", "b", "c, d"]
    assert parse_yaml("names:\n- a\n- b # x\n")["names"] == ["a", "b"]
    assert parse_yaml("names: {0: a, 1: b}")["names"] == {0: "a", 1: "b"}


def test_yolo_names_from_classes_txt_or_a_mapping(formats: dict[str, Path]) -> None:
    yolo = formats["yolo"]
    (yolo / "data.yaml").write_text("train: images/train\nval: images/val\nnames:\n  0: cat\n  1: dog\n  2: person\n")
    assert scan_source(yolo).classes == CLASSES
    (yolo / "data.yaml").unlink()
    with pytest.raises(SourceError, match="names no classes"):
        scan_source(yolo)
    (yolo / "classes.txt").write_text("cat\ndog\nperson\n")
    scan = scan_source(yolo)
    assert scan.classes == CLASSES and scan.split_names == [] and len(scan.files) == 3


# --- the box rules -----------------------------------------------------------------------------------------------------------


def test_degenerate_boxes_are_dropped_and_counted(tmp_path: Path) -> None:
    scenes = {"a": ((64, 48), "train", [((10, 5, 10, 25), "cat"), ((10, 5, 30, 25), "dog"), ((30, 9, 20, 12), "cat")])}
    for source in (write_coco(tmp_path / "coco", scenes), write_jsonl(tmp_path / "jsonl", scenes)):
        scan = scan_source(source)
        assert scan.target_meta["degenerate_dropped"] == 2, source
        assert scan.files[0].target.boxes == ((10.0, 5.0, 30.0, 25.0),) and scan.files[0].target.labels == (1,)


def test_the_build_report_and_info_count_the_degenerate_boxes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenes = {"a": ((64, 48), "train", [((10, 5, 10, 25), "cat"), ((10, 5, 30, 25), "dog"), ((30, 9, 20, 12), "cat")])}
    source = write_coco(tmp_path / "coco", scenes)
    assert cli.main(["build", str(source), str(tmp_path / "db.lmdb"), "--quiet"]) == 0
    assert "db.lmdb: 2 degenerate boxes dropped" in capsys.readouterr().out
    assert cli.main(["info", str(tmp_path / "db.lmdb")]) == 0
    assert "'degenerate_dropped': 2" in capsys.readouterr().out


def test_a_box_a_pixel_past_the_edge_is_clipped_more_is_refused_or_clipped_on_request(tmp_path: Path) -> None:
    scenes = {"a": ((64, 48), "train", [((-1, 0, 65, 20), "cat")])}
    scan = scan_source(write_jsonl(tmp_path / "one", scenes))
    assert scan.files[0].target.boxes == ((0.0, 0.0, 64.0, 20.0),) and scan.target_meta["clipped"] == 1
    beyond = {"a": ((64, 48), "train", [((0, 0, 66.5, 20), "cat")])}
    source = write_coco(tmp_path / "two", beyond)
    scan = scan_source(source)
    assert scan.files == []
    [(relpath, reason)] = scan.special
    assert relpath == "a.png" and "instances_train.json" in reason and "annotation id 101" in reason and "clip_boxes" in reason
    scan = scan_source(source, SourceOptions(clip_boxes=True))
    assert scan.files[0].target.boxes == ((0.0, 0.0, 64.0, 20.0),) and scan.target_meta["clipped"] == 1


def test_exif_orientation_is_counted_and_warned(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "yolo"
    write_yolo(folder)
    (folder / "images" / "val" / "c.png").unlink()
    _image(folder / "images" / "val" / "c.jpg", (50, 50), orientation=6)
    with caplog.at_level(logging.WARNING):
        scan = scan_source(folder)
    assert scan.target_meta["exif_rotated"] == 1
    assert "EXIF orientation" in caplog.text and "images/val/c.jpg" in caplog.text


def test_yolo_image_without_label_file_has_no_boxes_and_a_labels_folder_matching_nothing_is_refused(formats: dict[str, Path]) -> None:
    yolo = formats["yolo"]
    scan = scan_source(yolo)
    c = next(f for f in scan.files if f.relpath == "images/val/c.png")
    assert len(c.target) == 0 and c.origin == ""
    a = next(f for f in scan.files if f.relpath == "images/train/a.png")
    assert a.origin == "labels/train/a.txt"
    (yolo / "labels" / "train").rename(yolo / "labels" / "trian")
    with pytest.raises(SourceError, match=r"None of the 2 label files.*labels/trian/a.txt"):
        scan_source(yolo)


# --- bad input: each names its file and place --------------------------------------------------------------------------------


def _reason(scan, relpath: str) -> str:
    found = [reason for path, reason in scan.special if path == relpath]
    assert found, scan.special
    return found[0]


def test_coco_bad_input_names_the_json_and_the_id(tmp_path: Path) -> None:
    source = write_coco(tmp_path / "c")
    data = json.loads(source.read_text())
    data["annotations"][0]["category_id"] = 99  # image 1 (a.png)
    data["annotations"].append({"id": 555, "image_id": 42, "category_id": 1, "bbox": [0, 0, 1, 1]})
    data["images"].append({"id": 2, "file_name": "d.png"})  # a duplicate id
    data["images"].append({"id": 9, "file_name": "b.png"})  # a duplicate file name
    data["images"].append({"id": 10, "file_name": "missing.png"})
    source.write_text(json.dumps(data))
    scan = scan_source(source)
    assert [f.relpath for f in scan.files] == ["b.png", "c.png"]
    assert "annotation id 101" in _reason(scan, "a.png") and "category_id 99" in _reason(scan, "a.png")
    assert "image_id 42" in _reason(scan, "instances_train.json annotation id 555")
    assert "image id 2 is listed twice" in _reason(scan, "d.png")
    assert "image id 9" in [r for p, r in scan.special if p == "b.png"][0] and "listed already by image id 2" in _reason(scan, "b.png")
    assert "image id 10" in _reason(scan, "missing.png") and "missing" in _reason(scan, "missing.png")
    assert all("instances_train.json" in reason for _, reason in scan.special)


def test_coco_whole_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "instances_x.json"
    bad.write_text('{"images": [], "annotations": [], "categories": [')
    with pytest.raises(SourceError, match="instances_x.json.*not JSON"):
        scan_source(bad)
    bad.write_text('{"images": [], "annotations": [], "categories": [{"id": 1, "name": "a"}, {"id": 1, "name": "b"}]}')
    with pytest.raises(SourceError, match="category id 1 is listed twice"):
        scan_source(bad)


def test_other_json_is_not_taken_for_coco(tmp_path: Path) -> None:
    other = tmp_path / "config.json"
    other.write_text('{"lr": 0.1, "images": 3}')
    assert kind_of(other) is None
    with pytest.raises(FileNotFoundError, match="COCO detection JSON"):  # the message lists the kinds, COCO among them
        scan_source(other)
    lines = tmp_path / "rows.jsonl"
    lines.write_text('{"path": "a.png", "label": "x"}\n')
    assert kind_name(kind_of(lines)) == "manifest"


@pytest.mark.parametrize(("line", "said"), [
    ("0 0.5 0.5 0.2", "has 4 fields"),
    ("0 0.5 half 0.2 0.2", "are not four numbers"),
    ("0 0.5 0.5 1.2 0.2", "outside 0-1"),
    ("7 0.5 0.5 0.2 0.2", "class index 7 is beyond the 3 class names"),
    ("x 0.5 0.5 0.2 0.2", "is not a class index"),
    ("0 0.05 0.5 0.2 0.2", "outside the 64 x 48 image"),
])
def test_yolo_bad_line_names_the_file_and_line(formats: dict[str, Path], line: str, said: str) -> None:
    (formats["yolo"] / "labels" / "train" / "a.txt").write_text(f"1 0.5 0.5 0.1 0.1\n\n{line}\n")
    reason = _reason(scan_source(formats["yolo"]), "images/train/a.png")
    assert reason.startswith("labels/train/a.txt line 3") and said in reason


@pytest.mark.parametrize(("xml", "said"), [
    ("not xml at all <", "Annotations/a.xml is not XML"),
    ('<?xml version="1.0"?><!DOCTYPE a [<!ENTITY x "y">]><annotation/>', "DTD or entity"),
    ('<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE a [<!ENTITY x "y">]><annotation/>'.encode("utf-16"), "DTD or entity"),
    ("<annotation><filename>a.png</filename><object><name>cat</name></object></annotation>", "<size> is missing"),
    (_voc_xml("a.png", (64, 48), "<object><name>cat</name></object>"), "<object> 0 ('cat') has no <bndbox>"),
    (_voc_xml("a.png", (64, 48), "<object><name>cat</name><bndbox><xmin>1</xmin></bndbox></object>"), "lacks a number"),
    (_voc_xml("a.png", (64, 48), _voc_object("cat", (0, 0, 80, 10))), "<object> 0 ('cat') <bndbox>: box"),
    (_voc_xml("gone.png", (64, 48), ""), "missing"),
    (_voc_xml("a.png", (60, 48), ""), "<size> says 60 x 48, the image file is 64 x 48"),
])
def test_voc_bad_file_names_the_xml_and_element(formats: dict[str, Path], xml: str | bytes, said: str) -> None:
    (formats["voc"] / "Annotations" / "a.xml").write_bytes(xml if isinstance(xml, bytes) else xml.encode())
    scan = scan_source(formats["voc"])
    [(relpath, reason)] = scan.special
    assert "Annotations/a.xml" in reason and said in reason, reason
    assert len(scan.files) == 2


def test_manifest_bad_rows_name_the_line(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "m")
    rows = [json.loads(line) for line in source.read_text().splitlines()]
    rows[0]["labels"] = ["cat"]  # 2 boxes, 1 label
    rows[1]["boxes"][0] = [1, 2, 3]
    rows.append({"path": "images/nothere.png", "boxes": [], "labels": [], "split": "val"})
    _image(tmp_path / "m" / "images" / "d.png", (50, 50))
    rows.append({"path": "images/d.png", "boxes": [[0, 0, 90, 10]], "labels": ["cat"], "split": "val"})
    source.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    scan = scan_source(source)
    assert "boxes.jsonl line 1" in _reason(scan, "images/a.png") and "2 boxes but 1 labels" in _reason(scan, "images/a.png")
    assert "boxes.jsonl line 2" in _reason(scan, "images/b.png") and "[1, 2, 3]" in _reason(scan, "images/b.png")
    assert "line 4" in _reason(scan, "images/nothere.png") and "missing" in _reason(scan, "images/nothere.png")
    assert any("line 5" in r and "outside the 50 x 50 image" in r for p, r in scan.special if p == "images/d.png")


def test_manifest_boxes_with_indices_in_a_csv(tmp_path: Path) -> None:
    _image(tmp_path / "a.png", (64, 48))
    (tmp_path / "m.csv").write_text('path,boxes,labels\na.png,"[[10, 5, 30, 25]]","[2]"\n')
    scan = scan_source(tmp_path / "m.csv")
    assert scan.target_kind == "boxes" and scan.classes == ["0", "1", "2"]
    assert scan.files[0].target == Boxes(((10.0, 5.0, 30.0, 25.0),), (2,), image_size=(48, 64))


def test_options_a_detection_source_does_not_take_are_refused(formats: dict[str, Path]) -> None:
    with pytest.raises(OptionError, match="label_column='x'.*COCO"):
        scan_source(formats["coco"], SourceOptions(label_column="x"))
    with pytest.raises(OptionError, match="target_kind='class'"):
        scan_source(formats["voc"], SourceOptions(target_kind="class"))
    with pytest.raises(OptionError, match="clip_boxes"):
        SourceOptions(clip_boxes="yes")  # type: ignore[arg-type]


def test_coco_images_root_option_and_layouts(tmp_path: Path) -> None:
    source = write_coco(tmp_path / "c")
    moved = tmp_path / "elsewhere"
    (tmp_path / "c" / "images").rename(moved)
    with pytest.raises(SourceError, match="No images folder found.*root="):
        scan_source(source)
    assert len(scan_source(source, SourceOptions(root=str(moved))).files) == 3
    # COCO 2017: annotations/instances_train.json beside train/
    (tmp_path / "c" / "annotations").mkdir()
    moved.rename(tmp_path / "c" / "train")
    source = source.rename(tmp_path / "c" / "annotations" / "instances_train.json")
    scan = scan_source(source)
    assert scan.root == (tmp_path / "c" / "train").resolve() and len(scan.files) == 3


def test_target_kind_boxes_names_the_labels_column(tmp_path: Path) -> None:
    _image(tmp_path / "a.png", (64, 48))
    (tmp_path / "m.jsonl").write_text(json.dumps({"path": "a.png", "boxes": [[10, 5, 30, 25]], "cls": ["dog"]}) + "\n")
    options = SourceOptions(target_kind="boxes", label_column="cls")
    scan = scan_source(tmp_path / "m.jsonl", options)
    assert scan.classes == ["dog"] and scan.files[0].target == Boxes(((10.0, 5.0, 30.0, 25.0),), (0,), image_size=(48, 64))
    assert labels_of(tmp_path / "m.jsonl", options).target_kind == "boxes"
    (tmp_path / "n.jsonl").write_text(json.dumps({"path": "a.png", "label": "dog"}) + "\n")
    with pytest.raises(SourceError, match="no 'boxes' column for target_kind='boxes'"):
        scan_source(tmp_path / "n.jsonl", SourceOptions(target_kind="boxes"))
    write_coco(tmp_path / "coco")
    assert scan_source(tmp_path / "coco" / "instances_train.json", SourceOptions(target_kind="boxes")).classes == CLASSES


def test_cli_clip_boxes_flag() -> None:
    from lightning_lmdb.tools.cli import make_parser, manifest_options

    parser = make_parser()
    assert manifest_options(parser.parse_args(["build", "src", "out", "--clip-boxes"])).clip_boxes is True
    assert manifest_options(parser.parse_args(["build", "src", "out"])).clip_boxes is None


def test_datamodule_maps_a_val_json_through_the_train_classes(tmp_path: Path) -> None:
    from lightning_lmdb import LMDBDataModule

    train = write_coco(tmp_path / "c", name="instances_train.json")
    val = write_coco(tmp_path / "c", {"a": SCENES["a"]}, name="instances_val.json")
    data = json.loads(val.read_text())
    data["categories"] = [c for c in data["categories"] if c["name"] != "dog"]  # val has no dog: person would be 1, not 2
    val.write_text(json.dumps(data))
    dm = LMDBDataModule(train_dir=train, val_dir=val, cache_dir=tmp_path / "cache")
    assert dm.classes == CLASSES and dm.target_kind == "boxes" and dm.num_classes == 3
    options = dm._backend.split_options("val").manifest
    assert options.classes == tuple(CLASSES)
    assert scan_source(val, options).files[0].target.labels == (0, 2)
