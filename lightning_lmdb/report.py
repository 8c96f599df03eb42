"""A/B comparison of runs from the JSON summaries that ``PerfMonitor`` writes.

A multirun directory (e.g. Hydra's ``multirun/<date>/<time>/``) holds one subdirectory per run,
each with a :data:`SUMMARY_NAME` file. :func:`write_comparison` turns them into
``comparison.txt`` (a side-by-side table) and ``comparison.png`` (epoch time and data-wait per
epoch). Epoch 1 (cold: first pass, caches and workers not warmed) and the mean of later epochs
(warm) are reported apart. Speedups are ``raw epoch time / run epoch time`` against the ``raw``
run whose ``meta`` (minus ``backend``) matches, else the first ``raw`` run.

Run as ``python -m lightning_lmdb.report MULTIRUN_DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

SUMMARY_NAME = "perf_summary.json"
REFERENCE_BACKEND = "raw"
_ROWS = (  # (label, epoch key, scale, format)
    ("samples", "samples", 1.0, "{:.0f}"),
    ("epoch time s", "epoch_time_s", 1.0, "{:.2f}"),
    ("samples/s", "samples_per_s", 1.0, "{:.1f}"),
    ("data wait %", "data_wait_frac", 100.0, "{:.1f}"),
    ("GPU util %", "gpu_util_pct", 1.0, "{:.1f}"),
)


def load_summaries(multirun_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Load every :data:`SUMMARY_NAME` below ``multirun_dir``, sorted by path.

    Each summary gets a ``"path"`` key (the file it came from) and a ``"label"`` key: the
    backend, plus the ``meta`` values that differ between runs (e.g. ``"lmdb num_workers=4"``).

    Raises:
        FileNotFoundError: The directory is missing or holds no summary.
        ValueError: A summary is not valid JSON or has no ``epochs`` list.
    """
    root = Path(multirun_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"multirun_dir={str(root)!r} is not a directory.")
    paths = sorted(root.rglob(SUMMARY_NAME))
    if not paths:
        raise FileNotFoundError(
            f"No {SUMMARY_NAME} below {root}. HINT: train with "
            f"PerfMonitor(summary_path=<run dir>/{SUMMARY_NAME}, backend=...).")
    summaries = []
    for path in paths:
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path} is not valid JSON ({exc}); delete it or rerun that run.") from exc
        if not isinstance(summary, dict) or not isinstance(summary.get("epochs"), list):
            raise ValueError(f"{path} has no 'epochs' list; it was not written by PerfMonitor.")
        summary["path"] = str(path)
        summaries.append(summary)
    _add_labels(summaries)
    return summaries


def _add_labels(summaries: list[dict[str, Any]]) -> None:
    metas = [{k: v for k, v in (s.get("meta") or {}).items() if k != "backend"} for s in summaries]
    keys = sorted({k for m in metas for k in m})
    varying = [k for k in keys if len({json.dumps(m.get(k), sort_keys=True) for m in metas}) > 1]
    for summary, meta in zip(summaries, metas):
        parts = [str(summary.get("backend"))] + [f"{k}={meta.get(k)}" for k in varying]
        summary.setdefault("label", " ".join(parts) + ("" if summary.get("completed", True) else "*"))


def _phase_mean(summary: dict[str, Any], key: str, warm: bool) -> float | None:
    epochs = summary["epochs"][1:] if warm else summary["epochs"][:1]
    values = [e[key] for e in epochs if e.get(key) is not None]
    return statistics.fmean(values) if values else None


def _reference(summary: dict[str, Any], summaries: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    raws = [s for s in summaries if s.get("backend") == REFERENCE_BACKEND]
    same = [s for s in raws if {k: v for k, v in (s.get("meta") or {}).items() if k != "backend"}
            == {k: v for k, v in (summary.get("meta") or {}).items() if k != "backend"}]
    return (same or raws or [None])[0]


def comparison_table(summaries: Sequence[dict[str, Any]]) -> str:
    """Side-by-side text table, one column per run, cold and warm phases apart."""
    if not summaries:
        raise ValueError("summaries is empty; HINT: load them with load_summaries(multirun_dir).")
    labels = [s.get("label") or str(s.get("backend")) for s in summaries]
    warm_n = max((len(s["epochs"]) - 1 for s in summaries), default=0)
    header = ["", *labels]
    rows: list[list[str]] = []
    evicted = any((s.get("meta") or {}).get("cold_cache") for s in summaries)
    later = "cache evicted each epoch" if evicted else "warm"
    for warm, title in ((False, "epoch 1 (cold)"),
                        (True, f"epochs 2+ ({later}, mean of up to {warm_n})")):
        rows.append([title] + [""] * len(summaries))
        for name, key, scale, fmt in _ROWS:
            cells = []
            for s in summaries:
                value = _phase_mean(s, key, warm)
                cells.append("n/a" if value is None else fmt.format(value * scale))
            rows.append([f"  {name}", *cells])
        speedups = []
        for s in summaries:
            ref = _reference(s, summaries)
            mine = _phase_mean(s, "epoch_time_s", warm)
            theirs = None if ref is None else _phase_mean(ref, "epoch_time_s", warm)
            speedups.append("n/a" if not mine or theirs is None else f"{theirs / mine:.2f}x")
        rows.append([f"  speedup vs {REFERENCE_BACKEND}", *speedups])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join([header[0].ljust(widths[0])] + [h.rjust(w) for h, w in zip(header[1:], widths[1:])])]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join([row[0].ljust(widths[0])]
                               + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]).rstrip())
    if any(not s.get("completed", True) for s in summaries):
        lines.append("* run did not complete (summary written after an exception)")
    return "\n".join(lines) + "\n"


def plot_comparison(summaries: Sequence[dict[str, Any]], out_png: str | os.PathLike[str]) -> Path:
    """Plot epoch time and data-wait per epoch for each run (two subplots) to ``out_png``."""
    fig = Figure(figsize=(9, 4), layout="constrained")  # no pyplot: no global backend change
    ax_time, ax_wait = fig.subplots(1, 2, sharex=True)
    for s in summaries:
        epochs = [e["epoch"] + 1 for e in s["epochs"]]
        label = s.get("label") or str(s.get("backend"))
        ax_time.plot(epochs, [e["epoch_time_s"] for e in s["epochs"]], marker="o", label=label)
        ax_wait.plot(epochs, [e["data_wait_s"] for e in s["epochs"]], marker="o", label=label)
    for ax, title in ((ax_time, "epoch time (s)"), (ax_wait, "data wait (s)")):
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.xaxis.get_major_locator().set_params(integer=True)
    ax_time.legend()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=100)
    return out


def write_comparison(multirun_dir: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write ``comparison.txt`` and ``comparison.png`` into ``multirun_dir``; return their paths."""
    summaries = load_summaries(multirun_dir)
    txt = Path(multirun_dir) / "comparison.txt"
    txt.write_text(comparison_table(summaries), encoding="utf-8")
    return txt, plot_comparison(summaries, Path(multirun_dir) / "comparison.png")


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``python -m lightning_lmdb.report MULTIRUN_DIR``."""
    parser = argparse.ArgumentParser(
        prog="python -m lightning_lmdb.report",
        description="Write comparison.txt and comparison.png into a multirun directory.")
    parser.add_argument("multirun_dir", help=f"directory searched for {SUMMARY_NAME} files")
    text_path, png_path = write_comparison(parser.parse_args(argv).multirun_dir)
    print(text_path.read_text(encoding="utf-8") + f"plot: {png_path}")


if __name__ == "__main__":
    main()
