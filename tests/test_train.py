"""train.py: compose + fast_dev_run on both backends, the real multirun A/B, and the cold-cache option."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ci import evictable_folder, require
from hydra import compose, initialize_config_dir
from imagegen import make_jpegs

from lightning_lmdb.experiment import datamodule as dm_module
from lightning_lmdb.experiment.datamodule import ExperimentDataModule
from lightning_lmdb.read.transforms import eval_transform
from lightning_lmdb.tools import pagecache as cache

ROOT = Path(__file__).resolve().parents[1]
TINY = ["demo.num_classes=3", "demo.images_per_class=8", "data.image_size=16", "loader=debug", "data.build_workers=0",
        "trainer.enable_progress_bar=false", "model.width=8"]


@pytest.fixture
def train_module():
    sys.path.insert(0, str(ROOT))
    try:
        import train

        yield train
    finally:
        sys.path.remove(str(ROOT))


@pytest.mark.parametrize(
    ("data", "transforms", "loader"),
    [("lmdb", "default", "debug"), ("raw", "eval_only", "default")],
    ids=["lmdb-in-process", "raw-2-workers"],
)
def test_fast_dev_run_through_compose(tmp_path: Path, train_module, data: str, transforms: str, loader: str) -> None:
    """A fit through the composed config: the LMDB backend loading in this process (the database built by prepare_data), and
    the raw backend through two persistent worker processes with the transforms Hydra instantiates.

    Every other combination is composed and instantiated, without a fit, by tests/test_datamodule.py.
    """
    tiny = [o for o in TINY if not o.startswith("loader=")]
    overrides = [f"data={data}", f"transforms={transforms}", f"loader={loader}", f"paths.data_dir={tmp_path}", "+trainer.fast_dev_run=true"]
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, *tiny])
    summary = train_module.run(cfg, tmp_path / "out")
    assert summary["backend"] == data and summary["epochs"], summary
    assert summary["meta"]["num_workers"] == cfg.data.num_workers == (2 if loader == "default" else 0)
    epoch = summary["epochs"][0]
    training = 3 * 8 - round(0.1 * 3 * 8)  # TINY's demo: 3 classes of 8 images, val_fraction's default 0.1 held out
    assert epoch["batches"] == 1 and epoch["samples"] == epoch["loader_samples"] == min(cfg.data.batch_size, training), epoch  # one batch
    assert epoch["epoch_time_s"] > 0 and 0 <= epoch["data_wait_frac"] <= 1
    assert (tmp_path / "demo" / "class_00").is_dir(), "the demo dataset is generated on first use"
    assert list((tmp_path / "lmdb").glob("*.lmdb")) if data == "lmdb" else not (tmp_path / "lmdb").exists()


@pytest.mark.slow
def test_multirun_ab_repeats_interleaved_and_one_comparison(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "train.py", "-m", "data=raw,lmdb", "ab.repeats=2", "trainer.max_epochs=2", f"paths.data_dir={tmp_path}",
           f"hydra.sweep.dir={sweep}", *TINY]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    table = (sweep / "comparison.txt").read_text()
    assert table.startswith("verdict: ") and "raw" in table and "lmdb" in table and "speedup vs raw" in table
    assert "epoch 0 (cold)" in table and "epochs 1+ (warm" in table and " ± " in table
    assert (sweep / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.stdout.count("verdict: ") == 2, "the comparison is printed once, at the end of the multirun"
    assert "2 arm(s) of raw (n=2), lmdb (n=2)" in table, "the same overrides but the backend and the repeat: one arm per backend"
    assert "A/B outputs: " in result.stdout and "run raw: outputs in " in result.stdout
    jobs = []
    for job in ("0", "1", "2", "3"):
        summary = json.loads((sweep / job / "perf_summary.json").read_text())
        jobs.append((summary["backend"], summary["meta"]["repeat"]))
        overrides = summary["meta"]["overrides"]  # what the report's arms are made of (all but data= and ab.repeat=)
        assert f"data={summary['backend']}" in overrides and f"ab.repeat={summary['meta']['repeat']}" in overrides
        assert "trainer.max_epochs=2" in overrides
        assert len(summary["epochs"]) == 2 and summary["gpu_available"] is False
        with open(next((sweep / job / "csv").rglob("metrics.csv"))) as handle:
            rows = list(csv.DictReader(handle))
        logged = {k for row in rows for k, v in row.items() if v}
        assert {"perf/epoch_time_s", "perf/samples_per_s", "perf/data_wait_s", "perf/data_wait_frac", "train/loss", "val/acc"} <= logged
        assert list((sweep / job / "tensorboard").rglob("events.out.tfevents.*"))
    assert jobs == [("raw", 0), ("lmdb", 0), ("lmdb", 1), ("raw", 1)], "rounds interleave the backends"


@pytest.mark.parametrize("backend", ["lmdb", "raw"])
def test_cold_cache_evicts_before_each_epoch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    """On a filesystem that honours eviction (a tmpfs /tmp does not: then a folder on the checkout's disk)."""
    with evictable_folder(tmp_path) as folder:
        _check_cold_cache(folder, monkeypatch, backend)


def _check_cold_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    source = make_jpegs(tmp_path / "src", 12, size=64)
    dm = ExperimentDataModule(source, backend=backend, cache_dir=tmp_path / "cache", batch_size=4, num_workers=0, cold_cache=True,
                              val_fraction=0, train_transform=eval_transform(8), build_workers=0)
    dm.prepare_data()
    dm.setup("fit")
    files = dm.cached_files()
    assert files == ([str(dm.database_path("train"))] if backend == "lmdb" else [str(p) for p in sorted(source.rglob("*.jpg"))])
    residency = []
    real_evict = cache.evict

    def spy(paths, *, sync=False):
        real_evict(paths, sync=sync)
        residency.append(max(cache.resident_fraction(p) for p in paths))

    monkeypatch.setattr(dm_module.cache, "evict", spy)
    loader = dm.train_dataloader()
    for _ in range(2):
        assert sum(len(targets) for _, targets in loader) == 12
    assert len(residency) == 2, "one eviction per epoch"
    assert max(residency) < 0.05, f"files still cached after eviction: {residency}"
    assert cache.resident_fraction(files[0]) > 0.5, "reading the epoch brought the data back into the cache"


def test_cold_cache_turns_persistent_workers_off(tmp_path: Path) -> None:
    dm = ExperimentDataModule(make_jpegs(tmp_path / "src", 2, size=8), num_workers=2, persistent_workers=True, cold_cache=True)
    assert dm.persistent_workers is False


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.gpu
@pytest.mark.parametrize("decode_device", ["null", "cuda"])
def test_gpu_run_reports_utilisation(tmp_path: Path, train_module, decode_device: str) -> None:
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=["trainer=gpu", "trainer.max_epochs=1", f"paths.data_dir={tmp_path}",
                                          f"data.decode_device={decode_device}", *TINY])
    summary = train_module.run(cfg, tmp_path / "out")
    assert summary["gpu_available"] and summary["epochs"][0]["gpu_util_pct"] is not None
    assert summary["epochs"][0]["batch_transfer_s"] > 0


def test_checkpoint_every_n_steps_then_resume_completes_the_epoch(tmp_path: Path, train_module) -> None:
    # 24 demo images, 2 held out for validation -> 22 training samples, batch 4 -> 6 steps per epoch; stopped after step 2.
    tiny = [*TINY, "data.batch_size=4", "trainer.max_epochs=1", f"paths.data_dir={tmp_path}", "model=noop"]  # the loader resumes
    tiny.remove("model.width=8")
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        first = compose("train", overrides=[*tiny, "checkpoint_every_n_steps=2", "+trainer.max_steps=2"])
    train_module.run(first, tmp_path / "first")
    ckpt = tmp_path / "first" / "checkpoints" / "last.ckpt"
    assert ckpt.exists()
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        second = compose("train", overrides=[*tiny, f"ckpt_path={ckpt}"])
    summary = train_module.run(second, tmp_path / "second")
    assert [e["samples"] for e in summary["epochs"]] == [22 - 2 * 4], "the resumed epoch trains on the remaining samples only"


@pytest.mark.parametrize("model", ["noop", "toy_cnn"])
def test_val_fraction_zero_trains_on_every_image_without_validation(tmp_path: Path, train_module, model: str) -> None:
    overrides = [*TINY, f"model={model}", "data.val_fraction=0", "trainer.max_epochs=1", f"paths.data_dir={tmp_path}"]
    if model == "noop":
        overrides.remove("model.width=8")
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    summary = train_module.run(cfg, tmp_path / "out")
    assert [e["samples"] for e in summary["epochs"]] == [3 * 8], "every demo image is trained on"
    with open(next((tmp_path / "out" / "csv").rglob("metrics.csv"))) as handle:
        logged = {k for row in csv.DictReader(handle) for k, v in row.items() if v}
    assert not any(k.startswith("val/") for k in logged), logged


def _bad_folders(tmp_path: Path) -> dict[str, Path]:
    from imagegen import truncated_jpeg

    corrupt = make_jpegs(tmp_path / "corrupt", 4, size=16)
    (corrupt / "c0" / "broken.jpg").write_bytes(truncated_jpeg())
    empty_class = make_jpegs(tmp_path / "empty_class", 4, size=16)
    (empty_class / "c_empty").mkdir()
    return {"corrupt": corrupt, "empty_class": empty_class, "good": make_jpegs(tmp_path / "good", 4, size=16)}


def _one_line_error(train_module, cfg, out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited, train_module.one_line_errors():
        train_module.run(cfg, out)
    assert exited.value.code == 2
    err = capsys.readouterr().err  # a build's progress bar may come before the error
    last = err.rstrip("\n").rpartition("\n")[2]
    assert last.startswith("train.py: error: ") and err.count("train.py: error: ") == 1 and "Traceback" not in err, err
    return last


@pytest.mark.parametrize(
    ("folder", "override", "expected"),
    [
        ("corrupt", "data.on_error=raise", r"broken\.jpg: corrupt or truncated image.*data\.on_error=skip"),
        ("empty_class", "data.on_error=raise", r"no valid file for the classes c_empty.*remove the empty ones"),
        ("good", "data.batch_size=abc", r"batch_size='abc' must be an integer >= 1.*data\.batch_size="),
    ],
)
def test_expected_failures_are_one_line(tmp_path: Path, train_module, capsys: pytest.CaptureFixture[str], folder: str, override: str,
                                        expected: str) -> None:
    source = _bad_folders(tmp_path)[folder]
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=[*TINY, f"data.train_dir={source}", f"paths.data_dir={tmp_path}", override])
    assert re.search(expected, _one_line_error(train_module, cfg, tmp_path / "out", capsys))


@pytest.mark.slow
def test_a_read_only_cache_dir_is_one_line_naming_it(tmp_path: Path, train_module, capsys: pytest.CaptureFixture[str]) -> None:
    from lightning_lmdb.tools import netfs

    try:
        netfs.check_available()
    except netfs.NetfsUnavailableError as exc:
        require(False, f"FUSE unavailable (the read-only file system here is a latency mount): {exc}")
    (tmp_path / "ro_src").mkdir()
    source = make_jpegs(tmp_path / "src", 4, size=16)
    with netfs.mounted(tmp_path / "ro_src", tmp_path / "ro", latency_ms=0) as read_only:  # writes fail with EROFS, even for root
        with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
            cfg = compose("train", overrides=[*TINY, f"data.train_dir={source}", f"data.cache_dir={read_only.path}"])
        err = _one_line_error(train_module, cfg, tmp_path / "out", capsys)
    expected = (rf"cache_dir '{read_only.path}' is not writable \(a read-only file system.*"
                r"Choose a writable cache_dir \(Hydra: data\.cache_dir=")
    assert re.search(expected, err), err


def test_a_bug_still_shows_its_traceback(train_module) -> None:
    from hydra.errors import InstantiationException

    with pytest.raises(KeyError), train_module.one_line_errors():
        raise KeyError("a bug")
    with pytest.raises(ValueError, match="invalid literal"), train_module.one_line_errors():
        int("not raised by the project")  # a ValueError outside the project's code is a bug, not bad input
    with pytest.raises(InstantiationException), train_module.one_line_errors():
        try:
            {}["missing"]
        except KeyError as exc:
            raise InstantiationException("Error in call to target") from exc


@pytest.mark.slow
def test_train_py_reports_a_corrupt_image_in_one_line(tmp_path: Path) -> None:
    source = _bad_folders(tmp_path)["corrupt"]
    cmd = [sys.executable, "train.py", f"data.train_dir={source}", f"paths.data_dir={tmp_path}", f"hydra.run.dir={tmp_path / 'run'}", *TINY]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert re.search(r"\ntrain\.py: error: .*broken\.jpg: corrupt or truncated image.*\n$", result.stderr), result.stderr[-3000:]


def test_the_segmentation_demo_trains_through_compose(tmp_path: Path, train_module) -> None:
    """``demo.kind=segmentation``: the generated image + mask set, the fully convolutional toy model, mean IoU logged."""
    overrides = ["data=lmdb", "demo.kind=segmentation", "demo.count=12", "demo.size=32", f"paths.data_dir={tmp_path}",
                 "+trainer.fast_dev_run=true", *[o for o in TINY if not o.startswith("demo.")]]
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    summary = train_module.run(cfg, tmp_path / "out")
    training = 12 - 12 // 5  # every fifth pair is in the demo's val split
    assert summary["backend"] == "lmdb" and summary["epochs"][0]["samples"] == min(cfg.data.batch_size, training) == 10, summary
    assert (tmp_path / "demo_segmentation" / "train.csv").is_file() and not (tmp_path / "demo").exists()
    assert summary["meta"]["model"] == "ToyCNN"
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        bad = compose("train", overrides=["demo.kind=keypoints", f"paths.data_dir={tmp_path}"])
    with pytest.raises(train_module.lightning_lmdb.errors.OptionError, match="demo.kind='keypoints'"):
        train_module.run(bad, tmp_path / "out2")


def test_the_detection_demo_trains_through_compose_and_logs_map(tmp_path: Path, train_module) -> None:
    """``demo.kind=detection``: the generated COCO-layout demo (read by the COCO source kind), the toy detector, mAP logged."""
    overrides = ["data=lmdb", "demo.kind=detection", "demo.detection.count=10", "demo.detection.size=64", "data.image_size=32",
                 f"paths.data_dir={tmp_path}", "trainer.max_epochs=1", "+trainer.limit_train_batches=1", "+trainer.limit_val_batches=1",
                 *[o for o in TINY if not o.startswith(("demo.", "data.image_size"))]]
    with initialize_config_dir(str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    summary = train_module.run(cfg, tmp_path / "out")
    assert summary["backend"] == "lmdb" and summary["epochs"][0]["samples"] == min(cfg.data.batch_size, 8), summary  # 2 of 10 in val
    assert (tmp_path / "demo_detection" / "instances_train.json").is_file() and not (tmp_path / "demo").exists()
    metrics = "".join(p.read_text() for p in (tmp_path / "out").rglob("metrics.csv"))
    assert "val/map_50" in metrics and "val/map" in metrics, metrics
