"""The A/B comparison and its verdict, from the JSON summaries that ``PerfMonitor`` writes.

A multirun directory (e.g. Hydra's ``multirun/<date>/<time>/``) holds one subdirectory per run, each
with a :data:`SUMMARY_NAME` file. Runs are grouped into **arms** -- the backend plus every command-line
override (``meta["overrides"]``, recorded by ``train.py``) and every recorded setting that differs between
runs, but not the backend's own override (``data=``) or the repeat number (``ab.repeat=``), so
``-m data=raw,lmdb data.source_options.label_column=alpha,brightness`` makes four arms, never two pooled ones --
and every figure is reported per arm as the
median over its runs and the spread (half the range, ``±``), epoch 0 (cold: first pass, caches and
workers not warmed) and later epochs (warm, or evicted each epoch with ``cold_cache``) apart.
Epochs are numbered from 0 everywhere, as Lightning numbers them.

:func:`verdict` answers two questions apart, from the numbers:

1. **Is training data-bound?** Per arm, the share of each epoch the training loop waited for data
   (``>= DATA_BOUND_FRAC`` is data-bound), and the machine's CPU saturation (``>= CPU_SATURATED_FRAC``
   busy means loader workers and training compete for the cores: a low data-wait can hide it).
2. **Does storage matter here?** The difference of median epoch times between ``raw`` and ``lmdb``
   against the run-to-run spread: conclusive only when it exceeds twice the combined spread.

:func:`write_comparison` writes ``comparison.txt`` (the verdict on top, then the table) and
``comparison.png``; :class:`ABReport` (a Hydra callback) does it once at the end of a multirun and
prints where everything went. Run by hand as ``python -m lightning_lmdb.experiment.report MULTIRUN_DIR``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from lightning_lmdb.errors import OptionError, SourceError

SUMMARY_NAME = "perf_summary.json"
REFERENCE_BACKEND = "raw"
#: A run whose training loop waits for data this share of each epoch or more is data-bound.
DATA_BOUND_FRAC = 0.10
#: A machine this busy (all cores, from /proc/stat) is CPU-saturated.
CPU_SATURATED_FRAC = 0.90
#: Meta keys that do not define an arm (runs differing only in these are repeats of one arm).
_NOT_ARM = ("backend", "repeat", "overrides")
#: Overrides that do not define an arm: the backend (``data=raw`` / ``data=lmdb``, ``data.backend=``) and the repeat.
NOT_ARM_OVERRIDES = ("data", "data.backend", "ab.repeat")
_ROWS = (  # (label, epoch key, scale, format)
    ("samples", "samples", 1.0, "{:.0f}"),
    ("epoch time s", "epoch_time_s", 1.0, "{:.2f}"),
    ("samples/s", "samples_per_s", 1.0, "{:.0f}"),
    ("data wait %", "data_wait_frac", 100.0, "{:.1f}"),
    ("CPU busy %", "cpu_busy_frac", 100.0, "{:.0f}"),
    ("workers CPU s", "worker_cpu_s", 1.0, "{:.1f}"),
    ("read ms/sample", "loader_read_ms", 1.0, "{:.2f}"),
    ("decode ms/sample", "loader_decode_ms", 1.0, "{:.2f}"),
    ("transform ms/sample", "loader_transform_ms", 1.0, "{:.2f}"),
    ("GPU util %", "gpu_util_pct", 1.0, "{:.1f}"),
)


def load_summaries(multirun_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Load every :data:`SUMMARY_NAME` below ``multirun_dir``, sorted by path.

    Each summary gets a ``"path"`` key (the file it came from) and a ``"label"`` key naming its arm:
    the backend, plus the ``meta`` values that differ between runs other than the repeat number
    (e.g. ``"lmdb num_workers=4"``).

    Raises:
        FileNotFoundError: The directory is missing or holds no summary.
        ValueError: A summary is not valid JSON or has no ``epochs`` list.
    """
    root = Path(multirun_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"multirun_dir={str(root)!r} is not a directory.")
    paths = sorted(root.rglob(SUMMARY_NAME), key=_natural)  # job 2 before job 10
    if not paths:
        raise FileNotFoundError(
            f"No {SUMMARY_NAME} below {root}. HINT: train with "
            f"PerfMonitor(summary_path=<run dir>/{SUMMARY_NAME}, backend=...).")
    summaries = []
    for path in paths:
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise SourceError(f"{path} is not valid JSON ({exc}); delete it or rerun that run.") from exc
        if not isinstance(summary, dict) or not isinstance(summary.get("epochs"), list):
            raise SourceError(f"{path} has no 'epochs' list; it was not written by PerfMonitor.")
        summary["path"] = str(path)
        summaries.append(summary)
    _add_labels(summaries)
    return summaries


def _natural(path: Path) -> list[Any]:
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", str(path))]


def arm_overrides(overrides: Sequence[str]) -> dict[str, str]:
    """A run's command-line overrides (Hydra's ``key=value`` strings) that define its arm: all but :data:`NOT_ARM_OVERRIDES`."""
    pairs = (override.partition("=") for override in overrides)
    return {key: value for key, _, value in pairs if key.lstrip("+~") not in NOT_ARM_OVERRIDES}


def _varying(dicts: list[dict[str, Any]]) -> list[str]:
    keys = sorted({k for d in dicts for k in d})
    return [k for k in keys if len({json.dumps(d.get(k), sort_keys=True) for d in dicts}) > 1]


def _add_labels(summaries: list[dict[str, Any]]) -> None:
    """Label each run with its arm: the backend, the overrides that differ between runs, then each recorded setting that differs
    between runs those do not tell apart (``model=noop`` already tells ``model=NoOpModel``)."""
    metas = [{k: v for k, v in (s.get("meta") or {}).items() if k not in _NOT_ARM} for s in summaries]
    overrides = [arm_overrides((s.get("meta") or {}).get("overrides") or []) for s in summaries]
    swept = _varying(overrides)
    labels = [" ".join([str(s.get("backend"))] + [f"{k}={o.get(k)}" for k in swept]) for s, o in zip(summaries, overrides)]
    for key in _varying(metas):
        seen: dict[str, str] = {}
        if any(seen.setdefault(label, json.dumps(m.get(key), sort_keys=True)) != json.dumps(m.get(key), sort_keys=True)
               for label, m in zip(labels, metas)):
            labels = [f"{label} {key}={m.get(key)}" for label, m in zip(labels, metas)]
    for summary, label in zip(summaries, labels):
        summary.setdefault("label", label)


def grouping_line(summaries: Sequence[dict[str, Any]]) -> str:
    """How the runs were grouped into arms (the line under the verdict in ``comparison.txt``)."""
    grouped = arms(summaries)
    recorded = any("overrides" in (s.get("meta") or {}) for s in summaries)
    by = ("the backend and every override but the repeat (ab.repeat=) and the backend's (data=)" if recorded
          else "the backend and the recorded settings (these runs recorded no overrides)")
    return f"arms: runs grouped by {by}: {len(grouped)} arm(s) of " + ", ".join(f"{label} (n={len(r)})" for label, r in grouped.items())


def arms(summaries: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Runs grouped by arm label, arms in order of first appearance (the ``raw`` arm first when present)."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for s in summaries:
        grouped.setdefault(s.get("label") or str(s.get("backend")), []).append(s)
    return dict(sorted(grouped.items(), key=lambda item: item[1][0].get("backend") != REFERENCE_BACKEND))


@dataclass(frozen=True)
class Stat:
    """A figure over the runs of one arm: the median, the spread (half the range) and the number of runs."""

    median: float
    spread: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat | None:
        """The statistic of ``values`` (``None`` when there are none)."""
        if not values:
            return None
        return cls(statistics.median(values), (max(values) - min(values)) / 2, len(values))

    def format(self, fmt: str, scale: float = 1.0) -> str:
        """``median ± spread`` (just the median for one run)."""
        text = fmt.format(self.median * scale)
        return text if self.n < 2 else f"{text} ± {fmt.format(self.spread * scale)}"


#: Seconds before the first epoch, from the DataModule's timings (label, key in the summary's ``setup``).
_SETUP_ROWS = (("prepare_data s (build / stale-check scan)", "prepare_s"), ("setup s (raw: scan; lmdb: open)", "setup_s"))


def _run_value(summary: dict[str, Any], key: str, warm: bool) -> float | None:
    """One run's figure: epoch 0 (``warm=False``) or the mean of its later epochs."""
    epochs = summary["epochs"][1:] if warm else summary["epochs"][:1]
    values = [e[key] for e in epochs if e.get(key) is not None]
    return statistics.fmean(values) if values else None


def _measured(summary: dict[str, Any], key: str) -> float | None:
    """The figure the verdict uses: later epochs when there are any (the steady state), else epoch 0."""
    value = _run_value(summary, key, warm=True)
    return value if value is not None else _run_value(summary, key, warm=False)


def arm_stat(runs: Sequence[dict[str, Any]], key: str, warm: bool | None = None) -> Stat | None:
    """``key`` over the runs of an arm: epoch 0 (``warm=False``), later epochs (``True``) or as the verdict measures it (``None``)."""
    values = [v for r in runs if (v := (_measured(r, key) if warm is None else _run_value(r, key, warm))) is not None]
    return Stat.of(values)


def verdict(summaries: Sequence[dict[str, Any]]) -> list[str]:
    """Two lines: is training data-bound (per arm), and does storage matter (difference vs run-to-run spread)."""
    grouped = arms(summaries)
    waits = {label: arm_stat(runs, "data_wait_frac") for label, runs in grouped.items()}
    busy = {label: arm_stat(runs, "cpu_busy_frac") for label, runs in grouped.items()}
    known = {label: w for label, w in waits.items() if w is not None}
    data_bound = any(w.median >= DATA_BOUND_FRAC for w in known.values())
    if not known:
        lines = ["data-bound: unknown (no data-wait was measured)"]
    else:
        # one decimal: a share just under the threshold must not read as the threshold itself ("< 10% ... (10% (raw))")
        shares = " vs ".join(f"{w.median:.1%} ({label})" for label, w in known.items())
        if data_bound:
            lines = [f"data-bound: the training loop waited {shares} of each epoch"]
        else:
            lines = [f"not data-bound: the training loop waited < {DATA_BOUND_FRAC:.0%} of each epoch ({shares})"]
    saturated = {label: b for label, b in busy.items() if b is not None and b.median >= CPU_SATURATED_FRAC}
    if saturated:
        workers = any((w := arm_stat(grouped[label], "worker_cpu_s")) is not None and w.median > 0 for label in saturated)
        who = "loader workers saturate the CPU" if workers else "loading in the training process saturates the CPU"
        lines[0] += (
            f"; {who} ("
            + ", ".join(f"{b.median:.0%} busy with {label}" for label, b in saturated.items())
            + "): loading and training compete for the cores, so the data-wait understates the loader's cost"
        )
    pairs = _pairs(grouped)
    if not pairs:
        lines.append("storage: not compared (run both backends with the same settings: python train.py -m data=raw,lmdb)")
    lines += [_storage_line(raw_label, raw, label, runs, data_bound) for raw_label, raw, label, runs in pairs]
    return lines


def _settings(label: str) -> str:
    """An arm's label without its backend: the settings a raw arm must share to be its reference."""
    return label.split(" ", 1)[1] if " " in label else ""


def _pairs(grouped: dict[str, list[dict[str, Any]]]) -> list[tuple[str, list[dict[str, Any]], str, list[dict[str, Any]]]]:
    """(raw label, raw runs, label, runs) for each non-raw arm that has a raw arm with the same settings."""
    raws = {_settings(label): (label, runs) for label, runs in grouped.items() if runs[0].get("backend") == REFERENCE_BACKEND}
    return [(*raws[_settings(label)], label, runs) for label, runs in grouped.items()
            if runs[0].get("backend") != REFERENCE_BACKEND and _settings(label) in raws]


def _storage_line(raw_label: str, raw: list[dict[str, Any]], label: str, runs: list[dict[str, Any]], data_bound: bool) -> str:
    a, b = arm_stat(raw, "epoch_time_s"), arm_stat(runs, "epoch_time_s")
    if a is None or b is None:
        return f"storage: {label} vs {raw_label} not compared (no complete epoch in one of them)"
    if min(a.n, b.n) < 2:
        change = f"saved {a.median - b.median:.2f}" if a.median >= b.median else f"cost {b.median - a.median:.2f}"
        return (f"inconclusive: one run per backend, so the run-to-run spread is unknown; rerun with ab.repeats=3 "
                f"({label} {change} s/epoch vs {raw_label} in this run)")
    saved = a.median - b.median
    spread = math.hypot(a.spread, b.spread)
    runs_text = f"n={a.n} and {b.n}" if a.n != b.n else f"n={a.n}"
    if abs(saved) <= 2 * spread:
        prefix = "storage does not matter here" if not data_bound else "inconclusive"
        return (f"{prefix}: {label} vs {raw_label} differ by {abs(saved):.2f} s/epoch, within twice the run-to-run spread "
                f"(2 × {spread:.2f} s = {2 * spread:.2f} s, {runs_text})")
    if saved > 0:
        return f"{label} saves {saved:.2f} ± {spread:.2f} s/epoch vs {raw_label} ({a.median / b.median:.2f}x faster, {runs_text})"
    return f"{label} is slower than {raw_label} by {-saved:.2f} ± {spread:.2f} s/epoch ({b.median / a.median:.2f}x the time, {runs_text})"


def comparison_table(summaries: Sequence[dict[str, Any]]) -> str:
    """The verdict, then a side-by-side table: one column per arm, median ± spread, epoch 0 and later epochs apart."""
    if not summaries:
        raise OptionError("summaries is empty; HINT: load them with load_summaries(multirun_dir).")
    grouped = arms(summaries)
    runs_per_arm = [len(runs) for runs in grouped.values()]
    warm_n = max((len(s["epochs"]) - 1 for s in summaries), default=0)
    evicted = any((s.get("meta") or {}).get("cold_cache") for s in summaries)
    later = "cache evicted each epoch" if evicted else "warm"
    header = ["", *grouped]
    rows: list[list[str]] = [["runs (median ± spread)", *map(str, runs_per_arm)]]
    for name, key in _SETUP_ROWS:
        stats = [Stat.of([float(r["setup"][key]) for r in runs if key in (r.get("setup") or {})]) for runs in grouped.values()]
        if any(s is not None for s in stats):
            rows.append([name, *("n/a" if s is None else s.format("{:.2f}") for s in stats)])
    phases = [(False, "epoch 0 (cold)")] + ([(True, f"epochs 1+ ({later}, mean of {warm_n} per run)")] if warm_n else [])
    for warm, title in phases:
        rows.append([title] + [""] * len(grouped))
        for name, key, scale, fmt in _ROWS:
            stats = [arm_stat(runs, key, warm) for runs in grouped.values()]
            if all(s is None for s in stats):
                continue
            rows.append([f"  {name}", *("n/a" if s is None else s.format(fmt, scale) for s in stats)])
        ref = next((runs for runs in grouped.values() if runs[0].get("backend") == REFERENCE_BACKEND), None)
        ref_time = None if ref is None else arm_stat(ref, "epoch_time_s", warm)
        speedups = []
        for runs in grouped.values():
            mine = arm_stat(runs, "epoch_time_s", warm)
            speedups.append("n/a" if not mine or not mine.median or ref_time is None else f"{ref_time.median / mine.median:.2f}x")
        rows.append([f"  speedup vs {REFERENCE_BACKEND}", *speedups])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [f"verdict: {line}" for line in verdict(summaries)] + [grouping_line(summaries), ""]
    lines.append("  ".join([header[0].ljust(widths[0])] + [h.rjust(w) for h, w in zip(header[1:], widths[1:])]))
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join([row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]).rstrip())
    incomplete = [s["path"] for s in summaries if not s.get("completed", True)]
    if incomplete:
        lines.append(f"{len(incomplete)} run(s) did not complete (summary written after an exception): " + ", ".join(incomplete))
    return "\n".join(lines) + "\n"


def plot_comparison(summaries: Sequence[dict[str, Any]], out_png: str | os.PathLike[str]) -> Path:
    """Plot data-wait (% of the epoch, with the data-bound threshold), epoch time and throughput per epoch and arm.

    Each arm is drawn as the median over its runs with the min-max range shaded; epoch 0 (cold) is
    marked, and epochs are numbered from 0 as in the table.
    """
    fig = Figure(figsize=(13, 4), layout="constrained")  # no pyplot: no global backend change
    ax_wait, ax_time, ax_rate = fig.subplots(1, 3, sharex=True)
    for label, runs in arms(summaries).items():
        n_epochs = max(len(r["epochs"]) for r in runs)
        for ax, key, scale in ((ax_wait, "data_wait_frac", 100.0), (ax_time, "epoch_time_s", 1.0), (ax_rate, "samples_per_s", 1.0)):
            xs, mid, lo, hi = [], [], [], []
            for epoch in range(n_epochs):
                values = [r["epochs"][epoch][key] * scale for r in runs
                          if epoch < len(r["epochs"]) and r["epochs"][epoch].get(key) is not None]
                if values:
                    xs.append(epoch), mid.append(statistics.median(values)), lo.append(min(values)), hi.append(max(values))
            (line,) = ax.plot(xs, mid, marker="o", label=f"{label} (n={len(runs)})")
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15)
    ax_wait.axhline(DATA_BOUND_FRAC * 100, color="red", linestyle="--", linewidth=1, label=f"data-bound ({DATA_BOUND_FRAC:.0%})")
    evicted = any((s.get("meta") or {}).get("cold_cache") for s in summaries)
    for ax, title in ((ax_wait, "data wait (% of epoch)"), (ax_time, "epoch time (s)"), (ax_rate, "throughput (samples/s)")):
        ax.set_title(title)
        ax.set_xlabel("epoch (0 = cold" + ("; every epoch evicted)" if evicted else ")"))
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.axvspan(-0.3, 0.3, color="grey", alpha=0.1)
        ax.xaxis.get_major_locator().set_params(integer=True)
    ax_wait.legend(fontsize=8)
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=100)
    return out


def write_comparison(multirun_dir: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write ``comparison.txt`` (verdict and table) and ``comparison.png`` into ``multirun_dir``; return their paths."""
    summaries = load_summaries(multirun_dir)
    txt = Path(multirun_dir) / "comparison.txt"
    txt.write_text(comparison_table(summaries), encoding="utf-8")
    return txt, plot_comparison(summaries, Path(multirun_dir) / "comparison.png")


try:  # the Hydra callback exists only where Hydra is installed (the ``train`` extra)
    from hydra.experimental.callback import Callback as _HydraCallback
except ImportError:  # pragma: no cover
    _HydraCallback = object  # type: ignore[assignment,misc]


class ABReport(_HydraCallback):  # type: ignore[misc,valid-type]
    """Hydra callback: at the end of a multirun, write the comparison once and print the verdict and every output's path."""

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        """Write ``comparison.txt`` / ``comparison.png`` from every job's summary and print them."""
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            text_path, png_path = write_comparison(sweep_dir)
        except FileNotFoundError as exc:
            print(f"A/B: no comparison written ({exc})")
            return
        print(f"\n{text_path.read_text(encoding='utf-8')}\nA/B outputs: {text_path}, {png_path}; "
              f"each run's logs and {SUMMARY_NAME}: {sweep_dir}/<job number>/")


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``python -m lightning_lmdb.experiment.report MULTIRUN_DIR``."""
    parser = argparse.ArgumentParser(
        prog="python -m lightning_lmdb.experiment.report",
        description="Write comparison.txt and comparison.png into a multirun directory.")
    parser.add_argument("multirun_dir", help=f"directory searched for {SUMMARY_NAME} files")
    text_path, png_path = write_comparison(parser.parse_args(argv).multirun_dir)
    print(text_path.read_text(encoding="utf-8") + f"plot: {png_path}")


if __name__ == "__main__":
    main()
