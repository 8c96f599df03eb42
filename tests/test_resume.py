"""Mid-epoch resume: a run stopped after k batches plus its resume from the checkpoint see exactly the uninterrupted run's samples."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from PIL import Image

from lightning_lmdb import LMDBDataModule, LMDBImageDataset, shards
from lightning_lmdb.sampler import ResumableDataLoader, ResumableSampler
from lightning_lmdb.writer import build_lmdb

SAMPLES, BATCH = 30, 4  # 8 batches per epoch, the last one partial


def make_identified_images(root: Path, count: int = SAMPLES) -> Path:
    """``count`` tiny PNGs whose first pixel's red value is the image's number (its identity after loading)."""
    for i in range(count):
        path = root / f"c{i % 3}" / f"img_{i:03d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (4, 4), (i, 255 - i, 7)).save(path)
    return root


def identity(image: Image.Image) -> torch.Tensor:
    """The transform: an image becomes its identity."""
    return torch.tensor(int(np.asarray(image)[0, 0, 0]))


class Recorder(pl.LightningModule):
    """Records the identities of every training batch; optionally touches estimated_stepping_batches early."""

    def __init__(self, touch_stepping_batches: bool = False):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[list[int]] = []
        self.touch = touch_stepping_batches

    def training_step(self, batch, batch_idx):
        ids, _ = batch
        self.seen.append(ids.tolist())
        return self.layer(ids.float()[:, None]).sum() * 0.0

    def configure_optimizers(self):
        if self.touch:
            _ = self.trainer.estimated_stepping_batches  # the known Lightning trap: creates the train loader before the restore
        return torch.optim.SGD(self.parameters(), lr=0.0)


class Preempted(Exception):
    """Stands in for a job killed right after a checkpoint."""


class PreemptAfter(pl.Callback):
    """Saves a checkpoint after the ``batches``-th training batch of the run, then stops the run by raising."""

    def __init__(self, batches: int, path: Path):
        self.batches, self.path, self.count = batches, path, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.count += 1
        if self.count == self.batches:
            trainer.save_checkpoint(self.path)
            raise Preempted


def _datamodule(source: Path, cache: Path, backend: str, num_workers: int, persistent: bool) -> LMDBDataModule:
    return LMDBDataModule(source, backend=backend, cache_dir=cache, batch_size=BATCH, num_workers=num_workers, val_fraction=0,
                          persistent_workers=persistent, train_transform=identity, build_workers=0, split_seed=5)


def _fit(dm: LMDBDataModule, model: Recorder, epochs: int, callbacks=(), ckpt_path: Path | None = None) -> list[list[int]]:
    trainer = pl.Trainer(accelerator="cpu", max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, callbacks=list(callbacks))
    try:
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    except Preempted:
        pass
    return model.seen


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "num_workers", "persistent", "stop_after", "touch"),
    [
        ("lmdb", 0, False, 3, False),  # mid-epoch, in-process loading
        ("lmdb", 2, True, 3, False),  # mid-epoch, persistent workers
        ("lmdb", 2, False, 11, False),  # mid-way through the second epoch, fresh workers each epoch
        ("lmdb", 0, False, 8, False),  # exactly at the epoch boundary: must not skip the next epoch
        ("lmdb", 2, True, 5, True),  # estimated_stepping_batches touched before the restore
        ("raw", 2, False, 3, False),  # the raw backend
    ],
    ids=["lmdb-w0", "lmdb-w2-persistent", "lmdb-w2-epoch2", "lmdb-epoch-boundary", "lmdb-stepping-batches", "raw-w2"],
)
def test_stopped_plus_resumed_equals_uninterrupted(tmp_path: Path, backend: str, num_workers: int, persistent: bool,
                                                   stop_after: int, touch: bool) -> None:
    source = make_identified_images(tmp_path / "src")
    epochs = 2
    make = lambda: _datamodule(source, tmp_path / "cache", backend, num_workers, persistent)  # noqa: E731
    full = _fit(make(), Recorder(touch), epochs)
    assert len(full) == 2 * 8 and sorted(sum(full[:8], [])) == list(range(SAMPLES)), "each epoch sees every sample once"
    assert full[:8] != full[8:], "the order changes between epochs"
    ckpt = tmp_path / "preempted.ckpt"
    first = _fit(make(), Recorder(touch), epochs, [PreemptAfter(stop_after, ckpt)])
    assert len(first) == stop_after and ckpt.exists()
    second = _fit(make(), Recorder(touch), epochs, ckpt_path=ckpt)
    assert first + second == full, "the resumed run continues with exactly the samples that were next"


@pytest.mark.slow
def test_resume_with_the_same_datamodule_object(tmp_path: Path) -> None:
    # One DataModule for the preempted fit and its resume, with estimated_stepping_batches touched early:
    # the restored position must reach the resumed fit's new loader, not only the old one.
    source = make_identified_images(tmp_path / "src")
    full = _fit(_datamodule(source, tmp_path / "cache", "lmdb", 0, False), Recorder(True), 2)
    dm = _datamodule(source, tmp_path / "cache", "lmdb", 0, False)
    ckpt = tmp_path / "preempted.ckpt"
    first = _fit(dm, Recorder(True), 2, [PreemptAfter(3, ckpt)])
    second = _fit(dm, Recorder(True), 2, ckpt_path=ckpt)
    assert first + second == full


def test_sampler_order_is_a_pure_function_and_resume_skips_consumed() -> None:
    data = list(range(23))
    a = ResumableSampler(data, seed=3, num_replicas=2, rank=1)
    b = ResumableSampler(data, seed=3, num_replicas=2, rank=1)
    a.set_epoch(4), b.set_epoch(4)
    order = list(a)
    assert order == list(b) and len(order) == 12
    b.set_epoch(5)
    assert list(b) != order
    b.set_epoch(4)
    b.resume(epoch=4, consumed=8)
    assert b.start == 8 and list(b) == order[8:]
    assert list(b) == order, "a resume applies to one iteration only"
    b.resume(epoch=3, consumed=8)
    assert list(b) == order, "a position saved in another epoch does not apply to this one"


def test_loader_state_outside_lightning_counts_batches_handed_out() -> None:
    data = list(range(10))
    loader = ResumableDataLoader(data, ResumableSampler(data, seed=1), batch_size=3)
    it = iter(loader)
    seen = [next(it).tolist(), next(it).tolist()]
    state = loader.state_dict()
    assert state["consumed"] == 6 and state["epoch"] == 0
    again = ResumableDataLoader(data, ResumableSampler(data, seed=1), batch_size=3)
    again.load_state_dict(json.loads(json.dumps(state)))
    rest = [b.tolist() for b in again]
    assert sorted(sum(seen + rest, [])) == data and seen + rest == [b.tolist() for b in loader]
    other = ResumableDataLoader(data, ResumableSampler(data, seed=1, num_replicas=2, rank=0), batch_size=3)
    with pytest.raises(ValueError, match="world_size=1 then, 2 now"):
        other.load_state_dict(state)


def _database_loader(database: Path) -> ResumableDataLoader:
    dataset = LMDBImageDataset(database, transform=identity)
    return ResumableDataLoader(dataset, ResumableSampler(dataset, seed=2), batch_size=BATCH)


def test_resume_is_refused_on_another_build_of_the_same_size(tmp_path: Path) -> None:
    source = make_identified_images(tmp_path / "src")
    database = build_lmdb(source, tmp_path / "db.lmdb", workers=0, progress=False)
    first = _database_loader(database)
    batches = iter(first)
    seen = [next(batches)[0].tolist() for _ in range(2)]
    del batches
    state = json.loads(json.dumps(first.state_dict()))
    same = _database_loader(database)  # the same build: the rest of the epoch follows
    same.load_state_dict(state)
    rest = [batch[0].tolist() for batch in same]
    assert sorted(sum(seen + rest, [])) == list(range(SAMPLES))

    then = shards.build_id(database)
    (source / "c0" / "img_000.png").unlink()  # one file removed, one added: the same size, another order
    Image.new("RGB", (4, 4), (200, 55, 7)).save(source / "c2" / "img_200.png")
    build_lmdb(source, database, workers=0, progress=False)
    now = shards.build_id(database)
    rebuilt = _database_loader(database)
    assert now != then and len(rebuilt.dataset) == SAMPLES
    with pytest.raises(ValueError, match="Cannot resume the training loader mid-epoch") as caught:
        rebuilt.load_state_dict(state)
    message = str(caught.value)
    assert f"build {then} then, {now} now" in message and f"Restore the database of build {then}" in message
    assert "start a fresh epoch" in message and rebuilt.sampler.start == 0


def test_a_position_saved_without_a_build_id_is_applied_with_a_warning(tmp_path: Path) -> None:
    source = make_identified_images(tmp_path / "src")
    database = build_lmdb(source, tmp_path / "db.lmdb", workers=0, progress=False)
    first = _database_loader(database)
    batches = iter(first)
    next(batches)
    del batches
    old = {key: value for key, value in first.state_dict().items() if key != "build_id"}  # as a checkpoint of an older version
    again = _database_loader(database)
    with pytest.warns(UserWarning, match="without checking the database build"):
        again.load_state_dict(old)
    assert again.sampler.start == BATCH


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_two_rank_ddp_resume(tmp_path: Path, workers: int) -> None:
    source = make_identified_images(tmp_path / "src", 36)
    script = Path(__file__).parent / "scripts" / "ddp_resume.py"
    runs = {}
    for name, args in (("full", []), ("first", ["--stop-after", "3"]), ("second", ["--resume"])):
        out = tmp_path / name
        result = subprocess.run([sys.executable, str(script), str(source), str(tmp_path / "cache"), str(out), str(tmp_path / "ckpt"),
                                 "--workers", str(workers), *args], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for rank in range(2):
        full, first, second = (runs[n][rank] for n in ("full", "first", "second"))
        assert len(first) == 3 and first + second == full, f"rank {rank}"
    assert sorted(sum(runs["full"][0][:5] + runs["full"][1][:5], [])) == list(range(36)), "epoch 1: each sample once over both ranks"
