"""Where the loader's time goes: per-sample read / decode / transform, worker and machine CPU, and the no-op model."""

from __future__ import annotations

import dataclasses
import pickle
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from imagegen import SleepyTransform, make_jpegs
from torch.utils.data import ConcatDataset, DataLoader, Subset, TensorDataset

from lightning_lmdb.build.writer import build_lmdb
from lightning_lmdb.codec import storage as codec
from lightning_lmdb.experiment.callbacks import PerfMonitor, cpu_ticks, loader_stats_of, usable_cpus
from lightning_lmdb.experiment.toy_model import NoOpModel
from lightning_lmdb.read import dataset as dataset_module
from lightning_lmdb.read import raw as rawdataset_module
from lightning_lmdb.read.dataset import LMDBImageDataset
from lightning_lmdb.read.loadstats import LoaderStats
from lightning_lmdb.read.raw import RawImageDataset
from lightning_lmdb.read.transforms import eval_transform

IMAGES, BATCH = 48, 8
#: The known delay the fits' transform adds to every sample: the loader's transform time per sample is at least this.
TRANSFORM_SLEEP_S = 0.005
LOADER_TIMES = ("loader_read_ms", "loader_decode_ms", "loader_transform_ms")
LOADER_KEYS = (*LOADER_TIMES, "loader_samples", "loader_workers", "worker_cpu_s", "worker_cpu_frac")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("loader_stats")
    source = make_jpegs(root / "src", IMAGES, size=32)
    return source, build_lmdb(source, root / "train.lmdb", workers=0, progress=False)


def _dataset(data: tuple[Path, Path]) -> LMDBImageDataset:
    return LMDBImageDataset(data[1], transform=SleepyTransform(eval_transform(16), TRANSFORM_SLEEP_S))


def _fit(train: DataLoader, epochs: int = 1, val: DataLoader | None = None) -> PerfMonitor:
    monitor = PerfMonitor(verbose=False)
    trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", devices=1, callbacks=[monitor], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, limit_val_batches=0 if val is None else 1.0)
    trainer.fit(NoOpModel(2), train, val)
    assert len(monitor.history) == epochs
    return monitor


def _check_measured(record: dict, workers: int) -> None:
    assert record["loader_samples"] == record["samples"] == IMAGES, record
    # the transform sleeps a known time per sample: booked there, per sample, whatever the load (a lower bound)
    assert record["loader_transform_ms"] >= 1e3 * TRANSFORM_SLEEP_S, record
    assert record["loader_read_ms"] > 0 and record["loader_decode_ms"] > 0, record
    assert record["loader_workers"] == workers
    if workers:
        assert record["worker_cpu_s"] > 0 and record["worker_cpu_frac"] > 0
    else:
        assert record["worker_cpu_s"] == 0.0 and record["worker_cpu_frac"] == 0.0
    # /proc/stat counts 10 ms ticks: an epoch of these few images can fall between two (test_cpu_ticks checks a busy one)
    assert 0 <= record["cpu_busy_frac"] <= 1 and record["cores"] == len(usable_cpus())
    assert record["main_cpu_s"] > 0


# --- the no-op model ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_noop_model_trains_steps_and_changes_nothing(dtype: torch.dtype) -> None:
    images = torch.randint(0, 255, (12, 3, 8, 8)).to(dtype)
    loader = DataLoader(TensorDataset(images, torch.randint(0, 3, (12,))), batch_size=4)
    model = NoOpModel(num_classes=3, lr=0.1)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader, loader)
    assert trainer.global_step == 3
    assert torch.equal(model.w.detach(), torch.zeros(1))
    assert model.training_step(images[:2], 0).item() == 0.0  # a bare tensor batch works too


def test_noop_model_leaves_the_cpu_to_the_loader_while_it_trains() -> None:
    seen = []

    class Watch(pl.Callback):
        def on_train_batch_start(self, *args: object) -> None:
            seen.append(torch.get_num_threads())

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        loader = DataLoader(TensorDataset(torch.zeros(4, 3, 8, 8), torch.zeros(4)), batch_size=2)
        trainer = pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, callbacks=[Watch()])
        trainer.fit(NoOpModel(2), loader)
        assert seen == [1, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


# --- the dataset side ----------------------------------------------------------------------------------


STAGE_SLEEP_S, STAGE_SAMPLES = 0.05, 5
#: Where each stage's known delay goes: (module attribute of lightning_lmdb.read.dataset for LMDB, for raw files); None: the
#: LMDB dataset's record codecs' decode.
STAGE_CALLS = {"read": ("touch_pages", "read_file"), "decode": (None, "decode")}


def _slowed(function: Callable[..., Any]) -> Callable[..., Any]:
    def slowed(*args: Any, **kwargs: Any) -> Any:
        time.sleep(STAGE_SLEEP_S)
        return function(*args, **kwargs)

    return slowed


@pytest.mark.parametrize("stage", ["read", "decode", "transform"])
@pytest.mark.parametrize("kind", ["lmdb", "raw"])
def test_each_stage_books_its_own_time(data, monkeypatch: pytest.MonkeyPatch, kind: str, stage: str) -> None:
    source, database = data
    transform = SleepyTransform(eval_transform(16), STAGE_SLEEP_S) if stage == "transform" else eval_transform(16)
    dataset = LMDBImageDataset(database, transform=transform) if kind == "lmdb" else RawImageDataset(source, transform=transform)
    if stage in STAGE_CALLS:
        name = STAGE_CALLS[stage][kind == "raw"]
        if name is None:
            slowed = tuple(dataclasses.replace(kind, decode=_slowed(kind.decode)) for kind in codec.RECORD_CODECS)
            monkeypatch.setattr(codec, "RECORD_CODECS", slowed)
        else:
            module = rawdataset_module if kind == "raw" else dataset_module
            monkeypatch.setattr(module, name, _slowed(getattr(module, name)))
    stats = dataset.enable_loader_stats()
    dataset[0]  # opening the database, first imports: outside the period
    LoaderStats.next_period()
    for i in range(STAGE_SAMPLES):
        dataset[i]
    (load,) = stats.processes()
    assert load.slot == 0 and load.samples == STAGE_SAMPLES
    booked = {"read": load.read_s, "decode": load.decode_s, "transform": load.transform_s}
    injected = STAGE_SAMPLES * STAGE_SLEEP_S
    assert booked[stage] >= injected, f"{stage} slept {injected} s in all, booked: {booked}"
    # the others did a few tiny samples' work, far less than the sleep: time booked in two stages, or in the wrong one, shows
    assert all(seconds < injected for other, seconds in booked.items() if other != stage), booked


def test_cpu_time_is_the_processes_own(data) -> None:
    class Spin:
        """Burns ``seconds`` of this process's CPU time per sample (a lower bound on its CPU time, whatever the load)."""

        def __call__(self, image: Any) -> Any:
            end = time.process_time() + STAGE_SLEEP_S
            while time.process_time() < end:
                pass
            return eval_transform(16)(image)

    dataset = LMDBImageDataset(data[1], transform=Spin())
    dataset.enable_loader_stats()
    dataset[0]
    LoaderStats.next_period()
    for i in range(STAGE_SAMPLES):
        dataset[i]
    (load,) = dataset.loader_stats.processes()
    assert load.cpu_s >= STAGE_SAMPLES * STAGE_SLEEP_S and load.transform_s >= STAGE_SAMPLES * STAGE_SLEEP_S, load


def _raise(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("loader statistics are off: nothing may time, page-touch or record a sample")


@pytest.mark.parametrize("kind", ["lmdb", "raw"])
def test_stats_are_off_by_default_and_cost_nothing(data, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    source, database = data
    monkeypatch.setattr(dataset_module, "LoaderStats", _raise)  # no stats table is allocated
    monkeypatch.setattr(dataset_module, "touch_pages", _raise)  # no page touch
    monkeypatch.setattr(dataset_module, "time", types.SimpleNamespace(perf_counter=_raise))  # no timing
    monkeypatch.setattr(LoaderStats, "record", _raise)
    dataset = LMDBImageDataset(database) if kind == "lmdb" else RawImageDataset(source)
    train, val = dataset.split(0.25, seed=1)
    views = (dataset, dataset.view([3, 1], eval_transform(16)), train, val)
    assert all(view.loader_stats is None for view in views)
    assert [dataset[i][1] for i in (3, 1)] == [t for _, t in views[1]] == [dataset.targets[3], dataset.targets[1]]
    assert [t for _, t in val] == val.targets and len(list(train)) == len(train)


def test_datasets_pickle_without_stats_and_periods_start_empty(data) -> None:
    source, database = data
    for dataset in (LMDBImageDataset(database, transform=eval_transform(16)), RawImageDataset(source, transform=eval_transform(16))):
        assert dataset.loader_stats is None and dataset.view(None, None).loader_stats is None  # off until enabled
        stats = dataset.enable_loader_stats()
        assert isinstance(stats, LoaderStats) and dataset.loader_stats is stats and dataset.enable_loader_stats() is stats
        LoaderStats.next_period()
        for i in range(5):
            dataset[i]
        (load,) = stats.processes()
        assert load.slot == 0 and load.samples == 5
        LoaderStats.next_period()
        assert stats.processes() == []  # a new period starts empty
        # each view made once they are on has its own stats; a plain pickle leaves them out (it stays compact)
        view = dataset.view([0, 1], None)
        assert view.loader_stats is not None and view.loader_stats is not stats
        clone = pickle.loads(pickle.dumps(dataset))
        assert clone.loader_stats is None and clone[0][1] == dataset[0][1]
        assert clone.enable_loader_stats() is clone.loader_stats is not None


def test_loader_stats_of_finds_wrapped_datasets(data) -> None:
    dataset, other = _dataset(data), _dataset(data)
    loaders = {"a": DataLoader(Subset(dataset, [0, 1])), "b": [DataLoader(ConcatDataset([dataset, other]), num_workers=1)]}
    stats, in_process = loader_stats_of(loaders)
    assert {id(s) for s in stats} == {id(dataset.loader_stats), id(other.loader_stats)} and not in_process
    assert loader_stats_of(DataLoader(TensorDataset(torch.zeros(2)))) == ([], True)


def test_cpu_ticks_count_a_busy_core_as_busy() -> None:
    import time

    cpus = usable_cpus()
    busy, total = cpu_ticks(cpus)
    assert 0 <= busy <= total and total > 0
    end = time.perf_counter() + 0.3
    while time.perf_counter() < end:  # one core fully busy for 0.3 s: ~30 busy ticks of 10 ms
        pass
    busy_after, total_after = cpu_ticks(cpus)
    assert busy_after - busy >= 10, "a busy core's ticks are counted as busy"
    assert busy_after - busy <= total_after - total


# --- PerfMonitor -----------------------------------------------------------------------------------


def test_in_process_loading_is_measured(data) -> None:
    (record,) = _fit(DataLoader(_dataset(data), batch_size=BATCH)).history
    _check_measured(record, workers=0)


@pytest.mark.parametrize("persistent", [True, False])
def test_worker_loading_and_cpu_are_measured(data, persistent: bool) -> None:
    loader = DataLoader(_dataset(data), batch_size=BATCH, shuffle=True, num_workers=2, persistent_workers=persistent)
    monitor = _fit(loader, epochs=2)
    for record in monitor.history:
        _check_measured(record, workers=2)


class _StepsFromTrainer(NoOpModel):
    def configure_optimizers(self):
        assert self.trainer.estimated_stepping_batches > 0  # creates the train loader and starts its workers early
        time.sleep(0.5)  # they prefetch before on_fit_start
        return super().configure_optimizers()


def test_workers_started_before_fit_start_are_counted(data) -> None:
    monitor = PerfMonitor(verbose=False)
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, callbacks=[monitor], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(_StepsFromTrainer(2), DataLoader(_dataset(data), batch_size=BATCH, num_workers=2, persistent_workers=True))
    assert len(monitor.history) == 2, monitor.history
    for record in monitor.history:
        _check_measured(record, workers=2)


def test_datamodule_with_persistent_workers_and_validation(data, tmp_path) -> None:
    from lightning_lmdb.datamodule.module import LMDBDataModule

    dm = LMDBDataModule(data[0], val_fraction=0.25, cache_dir=tmp_path, build_workers=0, image_size=16, batch_size=BATCH,
                        num_workers=2, persistent_workers=True, train_transform=SleepyTransform(eval_transform(16), TRANSFORM_SLEEP_S))
    monitor = PerfMonitor(verbose=False)
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, callbacks=[monitor], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(NoOpModel(2), datamodule=dm)
    assert all(dataset.loader_stats is not None for dataset in dm.datasets.values())
    assert len(monitor.history) == 2, monitor.history
    for record in monitor.history:
        assert record["loader_samples"] == record["samples"] == IMAGES - round(IMAGES * 0.25), record
        assert record["loader_workers"] == 2 and record["worker_cpu_s"] > 0
        assert record["loader_transform_ms"] >= 1e3 * TRANSFORM_SLEEP_S, record


def test_a_datamodules_datasets_are_turned_on_before_its_workers_start(data) -> None:
    class Data(pl.LightningDataModule):
        """A user's DataModule: its dataset an attribute, a plain DataLoader (Lightning starts its workers before epoch start)."""

        def __init__(self) -> None:
            super().__init__()
            self.sets: dict[str, Any] = {}

        def setup(self, stage: str) -> None:
            self.sets["train"] = Subset(_dataset(data), range(IMAGES))

        def train_dataloader(self) -> DataLoader:
            return DataLoader(self.sets["train"], batch_size=BATCH, num_workers=2, persistent_workers=True)

    dm, monitor = Data(), PerfMonitor(verbose=False)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, callbacks=[monitor], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(NoOpModel(2), datamodule=dm)
    (record,) = monitor.history
    _check_measured(record, workers=2)


def test_validation_on_the_same_dataset_is_not_counted(data) -> None:
    dataset = _dataset(data)
    monitor = _fit(DataLoader(dataset, batch_size=BATCH), epochs=2, val=DataLoader(dataset, batch_size=BATCH))
    for record in monitor.history:
        assert record["val_time_s"] > 0
        _check_measured(record, workers=0)


def test_loaders_given_to_fit_are_measured_from_the_first_epoch(data) -> None:
    dataset = pickle.loads(pickle.dumps(_dataset(data)))  # a plain pickle: no stats
    assert dataset.loader_stats is None
    monitor = _fit(DataLoader(dataset, batch_size=BATCH, num_workers=2), epochs=2)
    assert dataset.loader_stats is not None
    for record in monitor.history:
        _check_measured(record, workers=2)


def test_workers_started_without_stats_report_none_that_epoch(data) -> None:
    class LoaderFromHook(NoOpModel):
        """Makes its dataset in train_dataloader(): the monitor first sees it after the first epoch's workers started."""

        def train_dataloader(self) -> DataLoader:
            return DataLoader(_dataset(data), batch_size=BATCH, num_workers=2)

    monitor = PerfMonitor(verbose=False)
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, callbacks=[monitor], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(LoaderFromHook(2))
    first, second = monitor.history
    assert all(first[key] is None for key in LOADER_KEYS)  # its workers were forked before the monitor saw it
    assert 0 <= first["cpu_busy_frac"] <= 1
    _check_measured(second, workers=2)  # fresh workers of the next epoch have them


def test_dataset_without_the_hook_reports_n_a(data) -> None:
    loader = DataLoader(TensorDataset(torch.zeros(IMAGES, 3, 4, 4), torch.zeros(IMAGES, dtype=torch.long)), batch_size=BATCH, num_workers=1)
    monitor = _fit(loader)
    (record,) = monitor.history
    assert all(record[key] is None for key in LOADER_KEYS)
    assert 0 <= record["cpu_busy_frac"] <= 1 and record["main_cpu_s"] > 0
    table = monitor.format_table()
    assert "CPU %" in table and "workers CPU s" in table and "n/a" in table
    assert monitor.summary()["cores"] == len(usable_cpus())


@pytest.mark.slow
def test_spawn_workers_are_measured(data) -> None:
    loader = DataLoader(_dataset(data), batch_size=BATCH, num_workers=1, persistent_workers=True, multiprocessing_context="spawn")
    monitor = _fit(loader, epochs=2)
    for record in monitor.history:
        _check_measured(record, workers=1)
