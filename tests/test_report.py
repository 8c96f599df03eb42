"""A/B report from two summaries shaped exactly like PerfMonitor writes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from lightning_lmdb.experiment.callbacks import PerfMonitor
from lightning_lmdb.experiment.report import (
    SUMMARY_NAME,
    comparison_table,
    load_summaries,
    plot_comparison,
    verdict,
    write_comparison,
)
from lightning_lmdb.experiment.sweeper import interleave


def _write_run(run_dir: Path, backend: str, times: list[float], wait_frac: float,
               gpu: float | None) -> None:
    monitor = PerfMonitor(backend=backend, meta={"backend": backend, "batch_size": 64})
    monitor.history = [
        {"epoch": i, "epoch_time_s": t, "batches": 10, "samples": 640, "samples_per_s": 640 / t,
         "data_wait_s": t * wait_frac, "data_wait_frac": wait_frac, "val_time_s": 0.5,
         "gpu_util_pct": gpu, "gpu_util_median_pct": gpu,
         "gpu_mem_peak_mb": None if gpu is None else 512.0}
        for i, t in enumerate(times)]
    run_dir.mkdir(parents=True)
    (run_dir / SUMMARY_NAME).write_text(json.dumps(monitor.summary()), encoding="utf-8")


@pytest.fixture
def multirun(tmp_path) -> Path:
    _write_run(tmp_path / "0", "raw", [10.0, 8.0, 8.0], 0.6, None)
    _write_run(tmp_path / "1", "lmdb", [5.0, 4.0, 4.0], 0.1, 85.0)
    (tmp_path / "1" / ".hydra").mkdir()  # unrelated files are ignored
    return tmp_path


def test_table_has_both_backends_and_speedup(multirun):
    summaries = load_summaries(multirun)
    assert [s["label"] for s in summaries] == ["raw", "lmdb"]
    table = comparison_table(summaries)
    lines = table.splitlines()
    assert lines[0].startswith("verdict: ") and lines[1].startswith("verdict: ")
    header = next(line for line in lines if line.strip().startswith("raw"))
    assert "lmdb" in header
    assert "epoch 0 (cold)" in table and "epochs 1+ (warm" in table
    speedups = [line.split()[-2:] for line in lines if "speedup vs raw" in line]
    assert speedups == [["1.00x", "2.00x"], ["1.00x", "2.00x"]]
    assert "n/a" in table and "85.0" in table and "60.0" in table


def test_write_comparison_writes_txt_and_valid_png(multirun):
    txt, png = write_comparison(multirun)
    assert txt == multirun / "comparison.txt" and png == multirun / "comparison.png"
    assert "speedup vs raw" in txt.read_text(encoding="utf-8")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(png) as image:
        image.verify()
        assert image.size[0] > 400


def test_no_reference_and_incomplete_runs(tmp_path):
    _write_run(tmp_path / "a", "lmdb", [3.0], 0.2, None)
    summary = json.loads((tmp_path / "a" / SUMMARY_NAME).read_text())
    summary["completed"] = False
    (tmp_path / "a" / SUMMARY_NAME).write_text(json.dumps(summary))
    table = comparison_table(load_summaries(tmp_path))
    assert "did not complete" in table
    assert "speedup vs raw" in table and "n/a" in table and "storage: not compared" in table
    plot_comparison(load_summaries(tmp_path), tmp_path / "out" / "plot.png")
    assert (tmp_path / "out" / "plot.png").stat().st_size > 0


def test_errors_name_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="perf_summary.json"):
        load_summaries(tmp_path)
    (tmp_path / SUMMARY_NAME).write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_summaries(tmp_path)


def _summary(backend: str, repeat: int, times: list[float], wait: float, busy: float | None = None) -> dict:
    epochs = [{"epoch": i, "epoch_time_s": t, "samples": 640, "samples_per_s": 640 / t, "data_wait_frac": wait,
               "data_wait_s": t * wait, "cpu_busy_frac": busy, "worker_cpu_s": 1.5} for i, t in enumerate(times)]
    return {"backend": backend, "meta": {"backend": backend, "repeat": repeat, "batch_size": 64}, "epochs": epochs,
            "label": backend}


def _ab(raw: list[tuple[float, float]], lmdb: list[tuple[float, float]], busy: float | None = None) -> list[dict]:
    """Interleaved runs: (warm epoch time, data-wait share) per repeat and backend."""
    runs = []
    for r, ((t_raw, w_raw), (t_lmdb, w_lmdb)) in enumerate(zip(raw, lmdb)):
        runs += [_summary("raw", r, [t_raw * 1.3, t_raw, t_raw], w_raw, busy),
                 _summary("lmdb", r, [t_lmdb * 1.3, t_lmdb, t_lmdb], w_lmdb, busy)]
    return runs


def test_verdict_clearly_data_bound_and_storage_helps() -> None:
    lines = verdict(_ab(raw=[(10.0, 0.41), (10.4, 0.43), (9.8, 0.40)], lmdb=[(6.0, 0.06), (6.2, 0.05), (5.9, 0.07)]))
    assert lines[0] == "data-bound: the training loop waited 41.0% (raw) vs 6.0% (lmdb) of each epoch"
    assert lines[1].startswith("lmdb saves 4.00 ± ") and "s/epoch vs raw (1.67x faster, n=3)" in lines[1]


def test_verdict_clearly_not_data_bound_storage_does_not_matter() -> None:
    lines = verdict(_ab(raw=[(5.0, 0.02), (5.1, 0.03), (4.9, 0.02)], lmdb=[(5.05, 0.02), (4.95, 0.01), (5.1, 0.02)]))
    assert lines[0].startswith("not data-bound: the training loop waited < 10% of each epoch (2.0% (raw) vs 2.0% (lmdb))")
    assert lines[1].startswith("storage does not matter here: lmdb vs raw differ by 0.05 s/epoch, within twice the run-to-run spread (2 × ")


def test_verdict_within_noise_is_inconclusive() -> None:
    lines = verdict(_ab(raw=[(5.0, 0.30), (7.0, 0.35), (6.0, 0.32)], lmdb=[(5.5, 0.28), (6.5, 0.30), (4.8, 0.29)]))
    assert lines[0].startswith("data-bound: ")
    assert lines[1].startswith("inconclusive: lmdb vs raw differ by 0.50 s/epoch, within twice the run-to-run spread (2 × ")


def test_verdict_one_run_each_and_cpu_saturation() -> None:
    lines = verdict(_ab(raw=[(10.0, 0.03)], lmdb=[(6.0, 0.02)], busy=0.97))
    assert "not data-bound" in lines[0] and "loader workers saturate the CPU (97% busy with raw, 97% busy with lmdb)" in lines[0]
    assert lines[1].startswith("inconclusive: one run per backend") and "ab.repeats=3" in lines[1]
    slower = verdict(_ab(raw=[(5.0, 0.2), (5.1, 0.2)], lmdb=[(8.0, 0.2), (8.1, 0.2)]))
    assert slower[1].startswith("lmdb is slower than raw by 3.00 ± 0.07 s/epoch")


def test_repeats_are_interleaved_and_tagged() -> None:
    jobs = [["data=raw"], ["data=lmdb"]]
    batches = interleave(jobs, repeats=3)
    assert batches == [[["data=raw", "ab.repeat=0"], ["data=lmdb", "ab.repeat=0"], ["data=lmdb", "ab.repeat=1"],
                        ["data=raw", "ab.repeat=1"], ["data=raw", "ab.repeat=2"], ["data=lmdb", "ab.repeat=2"]]]
    assert [len(b) for b in interleave(jobs, repeats=3, max_batch_size=4)] == [4, 2]


def test_verdict_pairs_each_backend_with_raw_of_the_same_settings() -> None:
    def run(backend: str, workers: int, time: float, repeat: int) -> dict:
        summary = _summary(backend, repeat, [time, time, time], 0.3)
        summary["meta"]["num_workers"] = workers
        del summary["label"]
        return summary

    summaries = [run(b, w, {("raw", 2): 10.0, ("lmdb", 2): 6.0, ("raw", 8): 3.0, ("lmdb", 8): 3.0}[b, w] + r * 0.01, r)
                 for r in range(3) for b in ("lmdb", "raw") for w in (2, 8)]
    from lightning_lmdb.experiment.report import _add_labels

    _add_labels(summaries)
    lines = verdict(summaries)
    assert lines[1].startswith("lmdb num_workers=2 saves 4.00") and "vs raw num_workers=2" in lines[1]
    assert "lmdb num_workers=8 vs raw num_workers=8" in lines[2] and len(lines) == 3


def test_one_run_each_says_which_way_and_jobs_sort_numerically(tmp_path) -> None:
    line = verdict(_ab(raw=[(10.0, 0.3)], lmdb=[(4.0, 0.3)]))[1]
    assert line.endswith("(lmdb saved 6.00 s/epoch vs raw in this run)")
    for job in (2, 10, 1):
        _write_run(tmp_path / str(job), "raw" if job != 10 else "lmdb", [1.0], 0.1, None)
    assert [Path(s["path"]).parent.name for s in load_summaries(tmp_path)] == ["1", "2", "10"]


def test_setup_seconds_are_shown_per_arm() -> None:
    runs = _ab(raw=[(10.0, 0.4), (10.2, 0.4)], lmdb=[(4.0, 0.05), (4.1, 0.05)])
    for run, seconds in zip(runs, (35.0, 0.02, 33.0, 0.04)):
        run["setup"] = {"setup_s": seconds} if run["backend"] == "raw" else {"prepare_s": 1.5, "setup_s": seconds}
    lines = comparison_table(runs).splitlines()
    scan = next(line for line in lines if line.startswith("setup s"))
    assert scan.split()[-6:] == ["34.00", "±", "1.00", "0.03", "±", "0.01"]
    prepare = next(line for line in lines if line.startswith("prepare_data s"))
    assert prepare.split()[-4:] == ["n/a", "1.50", "±", "0.00"]
    assert lines.index(prepare) < lines.index(scan) < next(i for i, line in enumerate(lines) if "epoch 0" in line)


# --- the verdict's rules at their edges -------------------------------------------------------------
# raw's warm epochs take 9, 10 and 11 s (spread 1.00) and lmdb's are all equal (spread 0): the combined
# spread is 1.00 s, so a difference up to 2.00 s is within twice the spread and anything more is a result.

_RAW = [9.0, 10.0, 11.0]


def _storage_line(lmdb_time: float, wait: float = 0.02) -> str:
    return verdict(_ab(raw=[(t, wait) for t in _RAW], lmdb=[(lmdb_time, wait)] * 3))[1]


@pytest.mark.parametrize(
    ("lmdb_time", "expected"),
    [
        (8.02, "storage does not matter here: lmdb vs raw differ by 1.98 s/epoch, within twice the run-to-run spread "
               "(2 × 1.00 s = 2.00 s, n=3)"),
        (8.0, "storage does not matter here: lmdb vs raw differ by 2.00 s/epoch, within twice the run-to-run spread "
              "(2 × 1.00 s = 2.00 s, n=3)"),
        (7.98, "lmdb saves 2.02 ± 1.00 s/epoch vs raw (1.25x faster, n=3)"),
        (11.98, "storage does not matter here: lmdb vs raw differ by 1.98 s/epoch, within twice the run-to-run spread "
                "(2 × 1.00 s = 2.00 s, n=3)"),
        (12.02, "lmdb is slower than raw by 2.02 ± 1.00 s/epoch (1.20x the time, n=3)"),
    ],
    ids=["just-under-2x-spread", "at-2x-spread", "just-over-2x-spread", "slower-just-under", "slower-just-over"],
)
def test_storage_verdict_at_twice_the_spread(lmdb_time: float, expected: str) -> None:
    assert _storage_line(lmdb_time) == expected


def test_a_difference_within_twice_the_spread_is_inconclusive_when_data_bound() -> None:
    assert _storage_line(8.02, wait=0.3) == ("inconclusive: lmdb vs raw differ by 1.98 s/epoch, within twice the run-to-run spread "
                                             "(2 × 1.00 s = 2.00 s, n=3)")


@pytest.mark.parametrize(
    ("wait", "expected"),
    [
        (0.099, "not data-bound: the training loop waited < 10% of each epoch (9.9% (raw) vs 9.9% (lmdb))"),
        (0.10, "data-bound: the training loop waited 10.0% (raw) vs 10.0% (lmdb) of each epoch"),
        (0.101, "data-bound: the training loop waited 10.1% (raw) vs 10.1% (lmdb) of each epoch"),
    ],
    ids=["just-under-10%", "at-10%", "just-over-10%"],
)
def test_data_bound_verdict_at_ten_percent(wait: float, expected: str) -> None:
    assert verdict(_ab(raw=[(10.0, wait)] * 3, lmdb=[(6.0, wait)] * 3))[0] == expected


def test_one_arm_over_ten_percent_makes_the_run_data_bound() -> None:
    line = verdict(_ab(raw=[(10.0, 0.101)] * 3, lmdb=[(6.0, 0.02)] * 3))[0]
    assert line == "data-bound: the training loop waited 10.1% (raw) vs 2.0% (lmdb) of each epoch"


@pytest.mark.parametrize(
    ("busy", "saturated"), [(0.899, False), (0.90, True), (0.901, True)], ids=["just-under-90%", "at-90%", "just-over-90%"]
)
def test_cpu_saturation_at_ninety_percent(busy: float, saturated: bool) -> None:
    line = verdict(_ab(raw=[(10.0, 0.02)] * 3, lmdb=[(6.0, 0.02)] * 3, busy=busy))[0]
    clause = ("; loader workers saturate the CPU (90% busy with raw, 90% busy with lmdb): loading and training compete for the "
              "cores, so the data-wait understates the loader's cost")
    not_bound = "not data-bound: the training loop waited < 10% of each epoch (2.0% (raw) vs 2.0% (lmdb))"
    assert line == not_bound + (clause if saturated else "")


def test_runs_are_grouped_by_every_override_but_the_backend_and_the_repeat(tmp_path) -> None:
    """``-m data=raw,lmdb data.manifest.label_column=alpha,brightness``: four arms (n=2 each), never alpha and brightness pooled."""
    times = {("raw", "alpha"): 10.0, ("lmdb", "alpha"): 6.0, ("raw", "brightness"): 4.0, ("lmdb", "brightness"): 4.0}
    job = 0
    for repeat in range(2):
        for (backend, column), time in times.items():
            _write_run(tmp_path / str(job), backend, [time * 1.3, time + repeat * 0.01, time + repeat * 0.01], 0.3, None)
            summary = json.loads((tmp_path / str(job) / SUMMARY_NAME).read_text())
            summary["meta"] = {**summary["meta"], "repeat": repeat,
                               "overrides": [f"data={backend}", f"data.manifest.label_column={column}", f"ab.repeat={repeat}"]}
            (tmp_path / str(job) / SUMMARY_NAME).write_text(json.dumps(summary))
            job += 1
    summaries = load_summaries(tmp_path)
    assert {s["label"] for s in summaries} == {f"{b} data.manifest.label_column={c}" for b, c in times}
    lines = verdict(summaries)
    assert lines[1].startswith("lmdb data.manifest.label_column=alpha saves 4.00") and "n=2" in lines[1]
    assert lines[2].startswith("inconclusive: lmdb data.manifest.label_column=brightness vs raw "
                               "data.manifest.label_column=brightness")
    table = comparison_table(summaries)
    said = next(line for line in table.splitlines() if line.startswith("arms: "))
    assert "every override but the repeat (ab.repeat=) and the backend's (data=)" in said and said.count("(n=2)") == 4


def test_a_recorded_setting_is_shown_only_where_the_overrides_do_not_tell_the_runs_apart() -> None:
    def run(backend: str, model: str, repeat: int) -> dict:
        summary = _summary(backend, repeat, [5.0, 5.0], 0.2)
        summary["meta"].update(model={"noop": "NoOpModel", "toy_cnn": "ToyCNN"}[model], overrides=[f"data={backend}", f"model={model}"])
        del summary["label"]
        return summary

    summaries = [run(b, m, r) for r in range(2) for b in ("raw", "lmdb") for m in ("noop", "toy_cnn")]
    from lightning_lmdb.experiment.report import _add_labels

    _add_labels(summaries)
    assert [s["label"] for s in summaries[:4]] == ["raw model=noop", "raw model=toy_cnn", "lmdb model=noop", "lmdb model=toy_cnn"]
