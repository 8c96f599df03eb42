"""Publishing a database to S3 and serving it from there (issue #34), against the loopback moto server (tests/s3kit.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from imagegen import make_jpegs
from s3kit import KEY, SECRET, S3Server

from lightning_lmdb import LMDBImageDataset, build_lmdb
from lightning_lmdb.errors import OptionError, RemoteChangedError, RemoteExistsError, RemoteIncompleteError, StagingError
from lightning_lmdb.remote import fs, objects
from lightning_lmdb.store import envs, published
from lightning_lmdb.tools import staging
from lightning_lmdb.tools.publish import pull, push

BLOCK = 1 << 20


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Multipart from 5 MiB up (S3's smallest part) so a 12 MiB file is 3 parts."""
    monkeypatch.setattr(objects, "MIN_PART", 5 << 20)
    monkeypatch.setattr(objects, "SINGLE_PUT", 5 << 20)


@pytest.fixture
def bucket(s3: S3Server) -> str:
    url = s3.bucket("pub")
    fs.use_options(url, s3.options)
    return url


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One database file of ~12 MiB (decoded pixels) and a sharded one (3 shards) of the same folder."""
    root = tmp_path_factory.mktemp("db")
    src = make_jpegs(root / "src", 42, size=320, classes=3)
    one = build_lmdb(src, root / "one" / "train.lmdb", workers=0, progress=False, storage="decoded")
    sharded = build_lmdb(src, root / "sharded" / "train.lmdb", workers=2, progress=False, storage="encoded", shards=3)
    return {"one": one, "sharded": sharded, "src": src}


def _samples(path: Path) -> list[tuple[bytes, int]]:
    dataset = LMDBImageDataset(path)
    out = [(dataset[i][0].tobytes(), dataset[i][1]) for i in range(len(dataset))]
    envs.close_all()
    return out


@pytest.mark.parametrize("kind", ["one", "sharded"])
def test_push_then_pull_serves_the_same_records(kind: str, built: dict[str, Path], bucket: str, tmp_path: Path,
                                                small_parts: None) -> None:
    url = f"{bucket}/data/{kind}.lmdb"
    report = push(built[kind], url, progress=False, block_size=BLOCK)
    assert report.action == "pushed" and report.bytes_uploaded > 0
    marker = json.loads(objects.read(published.marker_url(url)))
    assert marker["format"] == published.MARKER_FORMAT and marker["layout"] == ("file" if kind == "one" else "sharded")
    assert all(p["key"].startswith(f"parts/{marker['build_id']}/") for p in marker["parts"])
    if kind == "one":
        assert marker["parts"][0]["etag"].endswith("-3"), "a 12 MiB file goes up in 3 parts of 5 MiB"
    again = push(built[kind], url, progress=False, block_size=BLOCK)
    assert again.action == "up-to-date" and again.bytes_uploaded == 0
    staged = staging.stage_remote(url, tmp_path / "local")
    assert staged.action == "copied" and staged.path == tmp_path / "local" / f"{kind}.lmdb"
    assert _samples(staged.path) == _samples(built[kind])
    again = staging.stage_remote(url, tmp_path / "local")
    assert again.action == "up-to-date" and again.bytes_copied == 0


@pytest.mark.slow
def test_a_killed_upload_is_never_served_and_a_rerun_resumes(built: dict[str, Path], bucket: str, tmp_path: Path,
                                                            small_parts: None) -> None:
    url = f"{bucket}/killed.lmdb"
    script = ("import sys; sys.path[:0] = sys.argv[1:2]; from lightning_lmdb.remote import fs, objects; "
              "from lightning_lmdb.store import published; objects.MIN_PART = objects.SINGLE_PUT = 5 << 20; "
              "objects.PART_CONCURRENCY = 1; "
              f"fs.use_options({bucket!r}, {dict(fs.options_for(bucket))!r}); "
              f"published.push({str(built['one'])!r}, {url!r}, progress=False, block_size={BLOCK})")
    killed = subprocess.run([sys.executable, "-c", script, str(Path.cwd())], env={**os.environ, objects.FAULT_ENV: "upload:2"},
                            timeout=120, capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    with pytest.raises(RemoteIncompleteError, match="the upload did not finish: rerun the push") as info:
        pull(url, tmp_path / "local" / "x.lmdb")
    assert "\n" not in str(info.value) and SECRET not in str(info.value)
    report = push(built["one"], url, progress=False, block_size=BLOCK)
    size = built["one"].stat().st_size
    assert report.action == "resumed" and 0 < report.bytes_uploaded < size
    assert _samples(pull(url, tmp_path / "local" / "x.lmdb").path) == _samples(built["one"])


def test_a_dropped_download_resumes_and_a_bad_block_is_refused(built: dict[str, Path], bucket: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"{bucket}/dl.lmdb"
    push(built["one"], url, progress=False, block_size=BLOCK)
    size = built["one"].stat().st_size
    local = tmp_path / "local"

    class Killed(BaseException):
        pass

    def die() -> None:
        raise Killed

    monkeypatch.setattr(staging.os, "_exit", lambda code: die())
    monkeypatch.setenv(staging.REMOTE_FAULT_ENV, "3")
    monkeypatch.setattr(staging, "_downloaded", [0])
    with pytest.raises(Killed):
        staging.stage_remote(url, local)
    monkeypatch.delenv(staging.REMOTE_FAULT_ENV)
    assert (local / "dl.lmdb.staging").stat().st_size == 3 * BLOCK and not (local / "dl.lmdb").exists()
    report = staging.stage_remote(url, local)
    assert report.action == "resumed" and report.bytes_copied == size - 3 * BLOCK
    assert (local / "dl.lmdb").read_bytes() == built["one"].read_bytes()
    # a part replaced mid-download fails at once (If-Match), naming it
    real_read_many = objects.read_many

    def replaced_first(requests: list, concurrency: int = 1) -> list[bytes]:  # type: ignore[type-arg]
        if "/parts/" in requests[0][0]:
            objects.write(requests[0][0], b"replaced")
        return real_read_many(requests, concurrency)

    monkeypatch.setattr(objects, "read_many", replaced_first)
    with pytest.raises(RemoteChangedError, match=r"dl\.lmdb/parts/.* was replaced during the download"):
        staging.stage_remote(url, tmp_path / "changed")
    monkeypatch.setattr(objects, "read_many", real_read_many)
    push_again = objects.upload(str(built["one"]), published.read_marker(url).part_url(published.read_marker(url).parts[0]))
    assert push_again == published.read_marker(url).parts[0].etag
    # a block that does not match the marker's digest is refused, never recorded
    marker = published.read_marker(url)
    doctored = json.loads(marker.to_json())
    doctored["parts"][0]["blocks"][1] = "0" * 64
    objects.write(published.marker_url(url), json.dumps(doctored).encode())
    other = tmp_path / "other"
    with pytest.raises(StagingError, match=r"Block 1 .* does not match the SHA-256"):
        staging.stage_remote(url, other)
    assert json.loads((other / "dl.lmdb.staging.json").read_text())["blocks"] == [doctored["parts"][0]["blocks"][0]]


def test_two_publishers_race_the_marker_decides(built: dict[str, Path], bucket: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"{bucket}/race.lmdb"
    real_write = objects.write
    raced = []

    def first_wins(target: str, data: bytes, *, if_absent: bool = False) -> str:
        if target == published.marker_url(url) and if_absent and not raced:  # the other publisher's marker lands just before ours
            raced.append(True)
            push(built["sharded"], url, progress=False, block_size=BLOCK)
        return real_write(target, data, if_absent=if_absent)

    monkeypatch.setattr(objects, "write", first_wins)
    with pytest.raises(RemoteExistsError, match=r"another publisher wrote its marker first") as info:
        push(built["one"], url, progress=False, block_size=BLOCK)
    monkeypatch.setattr(objects, "write", real_write)
    winner = published.open_published(url)
    assert winner.layout == "sharded" and winner.build_id in str(info.value) and "delete the prefix" in str(info.value)
    keys = {o.url for o in objects.list_objects(f"{url}/parts")}
    assert all(f"/parts/{winner.build_id}/" in key for key in keys), "the loser's parts are deleted"
    with pytest.raises(RemoteExistsError, match="it holds another build"):
        push(built["one"], url, progress=False, block_size=BLOCK)


def test_a_remote_database_without_its_marker_is_one_clear_line(built: dict[str, Path], bucket: str, tmp_path: Path) -> None:
    url = f"{bucket}/nomarker.lmdb"
    push(built["sharded"], url, progress=False, block_size=BLOCK)
    objects.delete([published.marker_url(url)])
    with pytest.raises(RemoteIncompleteError, match="no lightning_lmdb.json") as info:
        pull(url, tmp_path / "x.lmdb")
    assert "\n" not in str(info.value)
    push(built["sharded"], url, progress=False, block_size=BLOCK)  # parts there: only the marker is written
    shard = next(p for p in published.read_marker(url).parts if p.path.startswith("shard-"))
    objects.write(published.read_marker(url).part_url(shard), b"truncated")
    with pytest.raises(RemoteIncompleteError, match=rf"its part {shard.path} is 9 bytes"):
        pull(url, tmp_path / "x.lmdb")


def test_datamodule_stages_a_remote_database(built: dict[str, Path], bucket: str, s3: S3Server, tmp_path: Path) -> None:
    from lightning_lmdb import LMDBDataModule

    url = f"{bucket}/dm/train.lmdb"
    push(built["sharded"], url, progress=False, block_size=BLOCK)
    with pytest.raises(OptionError, match="must be staged: pass local_cache_dir"):
        LMDBDataModule(train_dir=url, storage_options=s3.options, cache_dir=tmp_path / "cache")
    module = LMDBDataModule(train_dir=url, storage_options=s3.options, local_cache_dir=tmp_path / "local", cache_dir=tmp_path / "cache",
                            batch_size=4, num_workers=0, val_fraction=0.0, image_size=32)
    assert module.hparams.train_dir == url and "storage_options" not in module.hparams
    module.prepare_data()
    module.setup("fit")
    assert len(module.datasets["train"]) == len(LMDBImageDataset(built["sharded"]))
    assert (tmp_path / "local" / "train.lmdb" / "manifest.json").exists()
    envs.close_all()


def test_cli_push_pull_round_trip(built: dict[str, Path], s3: S3Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from lightning_lmdb.tools.cli import main

    url = s3.bucket("cli") + "/x.lmdb"
    options = [f"--storage-option=endpoint_url={s3.endpoint}", f"--storage-option=key={KEY}", f"--storage-option=secret={SECRET}"]
    assert main(["push", str(built["one"]), url, "--quiet", *options]) == 0
    assert main(["pull", url, str(tmp_path / "local" / "y.lmdb"), *options]) == 0
    out = capsys.readouterr()
    assert "pushed" in out.out and "copied" in out.out and SECRET not in out.out + out.err
    size = built["one"].stat().st_size
    assert f"pull {url}: {size / 1e6:,.0f} of {size / 1e6:,.0f} MB downloaded" in out.err, "the last progress line: all of it"
    assert (tmp_path / "local" / "y.lmdb").read_bytes() == built["one"].read_bytes()
    assert main(["info", url, *options]) == 0
    shown = capsys.readouterr().out
    assert "complete" in shown and "layout: file" in shown and SECRET not in shown
    assert main(["pull", url.replace("x.lmdb", "none.lmdb"), str(tmp_path / "l2"), *options]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the upload did not finish" in err and SECRET not in err


def test_cli_verify_of_a_url_checks_the_published_bytes_and_every_record(built: dict[str, Path], s3: S3Server, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from lightning_lmdb.tools.cli import main

    url = s3.bucket("verify") + "/x.lmdb"
    options = [f"--storage-option=endpoint_url={s3.endpoint}", f"--storage-option=key={KEY}", f"--storage-option=secret={SECRET}"]
    assert main(["push", str(built["one"]), url, "--quiet", *options]) == 0
    capsys.readouterr()
    work = tmp_path / "work"
    assert main(["verify", url, "--work-dir", str(work), *options]) == 0
    out = capsys.readouterr().out
    assert f"{url}: downloaded to a temporary copy" in out and "every block matched" in out and SECRET not in out
    assert out.strip().endswith("OK") or " OK" in out.splitlines()[-1], out
    assert list(work.iterdir()) == [], "the temporary copy is removed"
    # a part replaced behind the marker's back (same size: only its bytes differ) is caught, naming it
    marker = published.read_marker(url)
    (part,) = marker.parts
    data = bytearray(built["one"].read_bytes())
    data[len(data) // 2] ^= 0xFF
    s3.client.put_object(Bucket=url[5:].split("/")[0], Key=marker.part_url(part).split("/", 3)[3], Body=bytes(data))
    assert main(["verify", url, "--work-dir", str(work), *options]) == 2
    err = capsys.readouterr().err
    assert "x.lmdb" in err and SECRET not in err and err.count("\n") == 1, err


def test_build_to_s3_builds_in_work_dir_then_pushes(built: dict[str, Path], s3: S3Server, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_lmdb.errors import DiskFullError
    from lightning_lmdb.tools.cli import main

    url = s3.bucket("build") + "/built.lmdb"
    options = [f"--storage-option=endpoint_url={s3.endpoint}", f"--storage-option=key={KEY}", f"--storage-option=secret={SECRET}"]
    work = tmp_path / "work"
    args = ["build", str(built["src"]), url, "--work-dir", str(work), "--workers", "0", "--quiet", *options]
    assert main(args) == 0
    assert "pushed" in capsys.readouterr().out
    assert (work / "built.lmdb").is_file() and objects.exists(published.marker_url(url))
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "up-to-date" in out and " 0 bytes uploaded" in out
    copy = staging.stage_remote(url, tmp_path / "local")
    assert copy.path.read_bytes() == (work / "built.lmdb").read_bytes()
    leaked = [p for p in tmp_path.rglob("*") if p.is_file() and (SECRET.encode() in p.read_bytes() or KEY.encode() in p.read_bytes())]
    assert not leaked, "storage options never reach the disk"
    # too little space: refused before building, naming work_dir
    full = type("Usage", (), {"free": 1000})()
    monkeypatch.setattr("shutil.disk_usage", lambda path: full)
    with pytest.raises(DiskFullError, match=r"work_dir .*too little free space"):
        build_lmdb(built["src"], s3.bucket("full") + "/x.lmdb", work_dir=tmp_path / "w2", workers=0, progress=False)
    assert not (tmp_path / "w2" / "x.lmdb").exists()
    with pytest.raises(DiskFullError, match=r"local_dir .*needs [\d,]+ more bytes"):
        staging.stage_remote(url, tmp_path / "l3")


def test_storage_options_parse_and_a_prefix_without_marker_is_no_database(bucket: str) -> None:
    from lightning_lmdb.datamodule.options import remote_databases
    from lightning_lmdb.tools.cli import parse_storage_options

    assert parse_storage_options(["anon=true", "retries=3", "endpoint_url=http://h:9000", "use_ssl=False"]) == {
        "anon": True, "retries": 3, "endpoint_url": "http://h:9000", "use_ssl": False}
    with pytest.raises(OptionError, match="KEY=VALUE") as info:
        parse_storage_options([SECRET])
    assert SECRET not in str(info.value)
    objects.write(f"{bucket}/images/c0/a.jpg", b"not read here")
    assert remote_databases({"train": f"{bucket}/images", "val": None}, None) == {}


@pytest.mark.slow
def test_two_publisher_processes_one_wins(built: dict[str, Path], s3: S3Server) -> None:
    url = s3.bucket("race2") + "/both.lmdb"
    fs.use_options(url, s3.options)
    options = [f"--storage-option=endpoint_url={s3.endpoint}", f"--storage-option=key={KEY}", f"--storage-option=secret={SECRET}"]
    script = "import sys; sys.path[:0] = sys.argv[1:2]; from lightning_lmdb.tools.cli import main; sys.exit(main(sys.argv[2:]))"
    runs = [subprocess.Popen([sys.executable, "-c", script, str(Path.cwd()), "push", str(built[kind]), url, "--quiet", *options],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for kind in ("one", "sharded")]
    results = [(run.wait(timeout=120), *run.communicate()) for run in runs]
    winner = published.open_published(url)  # whatever the timing, a reader finds one complete build
    assert winner.build_id in {published.database.build_id(built[kind]) for kind in ("one", "sharded")}
    codes = sorted(rc for rc, _, _ in results)
    if codes == [0, 0]:
        # moto checks If-None-Match and stores the object in two steps (not atomic across its threads, unlike S3): both
        # conditional puts may pass when they land together; the marker is still one build's, checked above
        return
    assert codes == [0, 2], results
    loser_err = next(err for rc, _, err in results if rc == 2)
    assert "is published already" in loser_err and winner.build_id in loser_err and SECRET not in loser_err
    assert all(f"/parts/{winner.build_id}/" in o.url for o in objects.list_objects(f"{url}/parts")), "only the winner's parts stay"
