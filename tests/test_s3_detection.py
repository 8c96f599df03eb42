"""Detection sources on object storage (#34): a COCO JSON at a URL, a YOLO layout and a Pascal VOC layout under a prefix, a
manifest's boxes column at a URL build
as the same files do locally, record for record; a rebuild with nothing changed is up to date; an annotation object changed
after the build makes the database stale. Against a real S3 server on loopback (tests/s3kit.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from imagegen import read_records
from s3kit import S3Server
from test_detection_sources import write_coco, write_jsonl, write_voc, write_yolo
from test_s3_sources import upload

from lightning_lmdb.build.writer import build
from lightning_lmdb.errors import SourceError, StaleDatabaseError
from lightning_lmdb.remote import fs, objects, urls
from lightning_lmdb.sources.base import kind_name, kind_of, scan_source


@pytest.fixture
def bucket(s3: S3Server) -> str:
    url = s3.bucket()
    fs.use_options(url, s3.options)
    return url


def same_records(a: Path, b: Path) -> None:
    (meta_a, values_a), (meta_b, values_b) = read_records(a), read_records(b)
    assert values_a == values_b and len(values_a) > 0
    for key in ("targets", "paths", "checksums", "classes", "class_to_idx", "count", "target_kind", "target_meta", "splits"):
        assert meta_a.get(key) == meta_b.get(key), key


def _layouts(tmp_path: Path, bucket: str) -> dict[str, tuple[Path, str]]:
    """Per kind: the local source and its URL once its folder is uploaded under ``BUCKET/<kind>/``."""
    made = {"coco": write_coco(tmp_path / "coco" / "annotations", name="instances_train.json").parent.parent,
            "yolo": write_yolo(tmp_path / "yolo"), "voc": write_voc(tmp_path / "voc"),
            "manifest": write_jsonl(tmp_path / "manifest").parent}
    # COCO's images folder beside annotations/: images/train (the candidate <json dir>/../images/<split>)
    coco = tmp_path / "coco"
    (coco / "images" / "train").mkdir(parents=True)
    for image in (coco / "annotations" / "images").iterdir():
        image.rename(coco / "images" / "train" / image.name)
    (coco / "annotations" / "images").rmdir()
    sources = {"coco": (coco / "annotations" / "instances_train.json", f"{bucket}/coco/annotations/instances_train.json"),
               "yolo": (made["yolo"], f"{bucket}/yolo/"), "voc": (made["voc"], f"{bucket}/voc/"),
               "manifest": (made["manifest"] / "boxes.jsonl", f"{bucket}/manifest/boxes.jsonl")}
    for kind in made:
        upload(tmp_path / kind, f"{bucket}/{kind}")
    return sources


@pytest.mark.parametrize("kind", ["coco", "yolo", "voc", "manifest"])
def test_a_detection_source_on_object_storage_builds_as_the_local_one_and_goes_stale_with_its_annotations(
        kind: str, tmp_path: Path, bucket: str) -> None:
    local, url = _layouts(tmp_path, bucket)[kind]
    assert kind_name(kind_of(url)) == kind
    remote_scan, local_scan = scan_source(url), scan_source(local)
    assert [f.relpath for f in remote_scan.files] == [f.relpath for f in local_scan.files]
    assert [f.target for f in remote_scan.files] == [f.target for f in local_scan.files]
    assert all(f.etag and f.path.startswith(bucket) for f in remote_scan.files)
    build(url, tmp_path / "s3.lmdb", workers=0, progress=False)
    build(local, tmp_path / "local.lmdb", workers=0, progress=False)
    same_records(tmp_path / "s3.lmdb", tmp_path / "local.lmdb")
    assert build(url, tmp_path / "s3.lmdb", workers=0, progress=False, on_stale="error").action == "up-to-date"
    annotation = {"coco": url, "manifest": url, "yolo": urls.join(url, "labels/train/a.txt"),
                  "voc": urls.join(url, "Annotations/a.xml")}[kind]
    data = objects.read(annotation)
    edited = {"coco": data.replace(b"[10,", b"[11,", 1), "manifest": data.replace(b"[[10,", b"[[11,", 1), "yolo": b"1" + data[1:],
              "voc": data.replace(b"<xmin>11<", b"<xmin>12<", 1)}
    assert edited[kind] != data
    objects.write(annotation, edited[kind])  # a coordinate, or a class
    with pytest.raises(StaleDatabaseError):
        build(url, tmp_path / "s3.lmdb", workers=0, progress=False, on_stale="error")
    assert build(url, tmp_path / "s3.lmdb", workers=0, progress=False).action == "built"


def test_annotations_and_headers_come_in_batches_with_etags_and_no_request_per_image(tmp_path: Path, bucket: str,
                                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    sources = _layouts(tmp_path, bucket)
    batches: list[list[tuple]] = []
    real = objects.read_many
    monkeypatch.setattr(objects, "read_many", lambda requests, *a, **k: batches.append(list(requests)) or real(batches[-1], *a, **k))
    monkeypatch.setattr(objects, "stat", lambda url: pytest.fail(f"a HEAD of {url}"))
    scan = scan_source(sources["yolo"][1])
    labels = [r for batch in batches for r in batch if r[0].endswith(".txt")]
    assert len([b for b in batches if any(r[0].endswith(".txt") for r in b)]) == 1 and len(labels) == 2  # both label files at once
    heads = [r for batch in batches for r in batch if r[0].endswith(".png")]
    assert sorted(r[0] for r in heads) == sorted(f.path for f in scan.files) and all(r[1] and r[2] == 0 and r[3] for r in heads)
    batches.clear()
    scan_source(sources["voc"][1])
    xmls = [batch for batch in batches if any(r[0].endswith(".xml") for r in batch)]
    assert len(xmls) == 1 and len(xmls[0]) == 3 and all(r[1] for r in xmls[0])


def test_a_yolo_data_yaml_at_a_url_and_a_coco_root_given_as_a_url(tmp_path: Path, bucket: str) -> None:
    sources = _layouts(tmp_path, bucket)
    by_prefix = scan_source(sources["yolo"][1])
    by_yaml = scan_source(f"{bucket}/yolo/data.yaml")
    assert kind_name(kind_of(f"{bucket}/yolo/data.yaml")) == "yolo"
    assert [(f.path, f.target, f.split) for f in by_yaml.files] == [(f.path, f.target, f.split) for f in by_prefix.files]
    from lightning_lmdb.sources.base import SourceOptions

    given = scan_source(sources["coco"][1], SourceOptions(root=f"{bucket}/coco/images/train"))
    assert [f.target for f in given.files] == [f.target for f in scan_source(sources["coco"][0]).files]
    with pytest.raises(SourceError, match="root="):
        scan_source(sources["coco"][1], SourceOptions(root=str(tmp_path)))


def test_the_folder_kind_asked_for_a_yolo_or_voc_prefix_names_the_layout(tmp_path: Path, bucket: str) -> None:
    from lightning_lmdb.sources import folder

    sources = _layouts(tmp_path, bucket)
    for kind, said in (("yolo", "YOLO folder"), ("voc", "Pascal VOC folder")):
        with pytest.raises(SourceError, match=f"laid out as a {said}.*not as an image folder"):
            folder.scan(sources[kind][1])
