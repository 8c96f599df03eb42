"""Mid-epoch resume: a run stopped after k batches plus its resume from the checkpoint see exactly an uninterrupted run's samples.

The order of an epoch is a pure function of the seed (``ResumableSampler``), so the uninterrupted run's batches are
computed in this process (:func:`expected_batches`) instead of trained: only the stopped run and its resume are fits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from PIL import Image

from lightning_lmdb import LMDBDataModule, LMDBImageDataset
from lightning_lmdb.build.writer import build_lmdb
from lightning_lmdb.read import blockread
from lightning_lmdb.read.sampler import ResumableDataLoader, ResumableSampler
from lightning_lmdb.store import envs, shards

SAMPLES, BATCH, SEED = 30, 4, 5  # 8 batches per epoch, the last one partial; SEED is the DataModules' split_seed


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


def _datamodule(source: Path, cache: Path, backend: str = "lmdb", num_workers: int = 0, persistent: bool = False,
                **changes) -> LMDBDataModule:
    """The DataModule of these tests; ``changes`` override any of its settings."""
    settings = dict(backend=backend, cache_dir=cache, batch_size=BATCH, num_workers=num_workers, val_fraction=0,
                    persistent_workers=persistent, train_transform=identity, build_workers=0, split_seed=SEED)
    return LMDBDataModule(source, **{**settings, **changes})


def _fit(dm: LMDBDataModule, model: Recorder, epochs: int, callbacks=(), ckpt_path: Path | None = None) -> list[list[int]]:
    trainer = pl.Trainer(accelerator="cpu", max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0, callbacks=list(callbacks))
    try:
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    except Preempted:
        pass
    return model.seen


def expected_batches(dm: LMDBDataModule, epochs: int, replicas: int = 1, rank: int = 0, **order) -> list[list[int]]:
    """The identities of the batches an uninterrupted fit of ``dm`` trains on (this rank's), computed in this process.

    Reads each training sample's identity through ``dm``'s own training dataset, and takes the order from a
    ``ResumableSampler`` built here from the tests' settings (seed ``SEED``, ``order``: e.g. ``shuffle``, ``block_size``).
    """
    dm.prepare_data()
    dm.setup("fit")
    train = dm.datasets["train"]
    identities = [int(train[row][0]) for row in range(len(train))]
    envs.close_all()  # as setup leaves it: no environment held across the fits' forks
    assert sorted(identities) == list(range(len(train))), "each image once in the training data"
    sampler = ResumableSampler(list(range(len(train))), seed=SEED, num_replicas=replicas, rank=rank, **order)
    batches = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        ids = [identities[row] for row in sampler]
        batches += [ids[i:i + BATCH] for i in range(0, len(ids), BATCH)]
    return batches


def test_expected_batches_are_every_sample_once_per_epoch_in_a_new_order(tmp_path: Path) -> None:
    source = make_identified_images(tmp_path / "src")
    full = expected_batches(_datamodule(source, tmp_path / "cache"), 2)
    assert len(full) == 2 * 8 and all(len(b) == BATCH for b in full[:7]) and len(full[7]) == SAMPLES - 7 * BATCH
    assert sorted(sum(full[:8], [])) == sorted(sum(full[8:], [])) == list(range(SAMPLES)), "each epoch sees every sample once"
    assert full[:8] != full[8:], "the order changes between epochs"


@pytest.mark.parametrize(
    ("backend", "then", "now", "stop_after", "touch"),
    [
        pytest.param("lmdb", (0, False), (0, False), 3, False, id="lmdb-w0"),  # mid-epoch, in-process loading
        pytest.param("lmdb", (0, False), (0, False), 8, False, id="lmdb-epoch-boundary"),  # must not skip the next epoch
        pytest.param("lmdb", (2, True), (0, False), 3, False, id="lmdb-w2-persistent-then-w0", marks=pytest.mark.slow),
        # mid-way through the second epoch, resumed with workers started afresh each epoch
        pytest.param("lmdb", (0, False), (2, False), 11, False, id="lmdb-w0-then-w2-epoch2", marks=pytest.mark.slow),
        # estimated_stepping_batches touched before the restore; persistent_workers changed
        pytest.param("lmdb", (2, True), (2, False), 5, True, id="lmdb-stepping-batches-persistent-then-not", marks=pytest.mark.slow),
        pytest.param("raw", (2, False), (2, True), 3, False, id="raw-w2-then-persistent", marks=pytest.mark.slow),
    ],
)
def test_stopped_plus_resumed_equals_uninterrupted(tmp_path: Path, backend: str, then: tuple[int, bool], now: tuple[int, bool],
                                                   stop_after: int, touch: bool) -> None:
    """``then``/``now``: ``(num_workers, persistent_workers)`` of the stopped run and of its resume (the README allows a change)."""
    source = make_identified_images(tmp_path / "src")
    make = lambda workers, persistent: _datamodule(source, tmp_path / "cache", backend, workers, persistent)  # noqa: E731
    full = expected_batches(make(0, False), 2)
    ckpt = tmp_path / "preempted.ckpt"
    first = _fit(make(*then), Recorder(touch), 2, [PreemptAfter(stop_after, ckpt)])
    assert len(first) == stop_after and ckpt.exists()
    second = _fit(make(*now), Recorder(touch), 2, ckpt_path=ckpt)
    assert first + second == full, "the resumed run continues with exactly the samples that were next, in the same order"


def test_resume_with_the_same_datamodule_object(tmp_path: Path) -> None:
    # One DataModule for the preempted fit and its resume, with estimated_stepping_batches touched early:
    # the restored position must reach the resumed fit's new loader, not only the old one.
    source = make_identified_images(tmp_path / "src")
    full = expected_batches(_datamodule(source, tmp_path / "cache"), 2)
    dm = _datamodule(source, tmp_path / "cache")
    ckpt = tmp_path / "preempted.ckpt"
    first = _fit(dm, Recorder(True), 2, [PreemptAfter(3, ckpt)])
    second = _fit(dm, Recorder(True), 2, ckpt_path=ckpt)
    assert first + second == full


def _saved_after_two_batches(dm: LMDBDataModule) -> dict:
    """``dm``'s state (as a checkpoint holds it: through JSON) after two batches of its training loader."""
    dm.prepare_data()
    dm.setup("fit")
    batches = iter(dm.train_dataloader())
    next(batches), next(batches)
    del batches
    state = json.loads(json.dumps(dm.state_dict()))
    assert state["train_loader"]["consumed"] == 2 * BATCH
    return state


@pytest.mark.parametrize(
    ("backend", "change", "differs"),
    [
        ("lmdb", {"batch_size": 5}, "batch_size=4 then, 5 now"),
        ("lmdb", {"split_seed": SEED + 1}, f"seed={SEED} then, {SEED + 1} now"),
        ("lmdb", {"drop_last": True}, "drop_last=False then, True now"),
        ("lmdb", {"val_fraction": 0.1}, f"dataset_size={SAMPLES} then, {SAMPLES - 3} now"),  # 3 of the 30 held out
        ("raw", {"add_an_image": True}, f"dataset_size={SAMPLES} then, {SAMPLES + 1} now"),  # the folder itself changed
    ],
    ids=["batch_size", "seed", "drop_last", "dataset_size-split", "dataset_size-raw-folder"],
)
def test_resume_with_another_order_is_refused_naming_what_changed(tmp_path: Path, backend: str, change: dict, differs: str) -> None:
    source = make_identified_images(tmp_path / "src")
    state = _saved_after_two_batches(_datamodule(source, tmp_path / "cache", backend))
    same = _datamodule(source, tmp_path / "cache", backend)
    same.setup("fit")
    same.load_state_dict(state)
    assert same.train_dataloader().sampler.start == 2 * BATCH, "the same settings resume"
    if change.pop("add_an_image", False):
        Image.new("RGB", (4, 4), (SAMPLES, 0, 7)).save(source / "c0" / f"img_{SAMPLES:03d}.png")
    changed = _datamodule(source, tmp_path / "cache", backend, **change)
    changed.prepare_data()
    changed.setup("fit")
    changed.load_state_dict(state)
    with pytest.raises(ValueError, match="Cannot resume the training loader mid-epoch") as caught:
        changed.train_dataloader()
    message = str(caught.value)
    assert f"it was saved with {differs}." in message, "the changed value, and only it, is named"
    assert "Resume with the same settings" in message and "start a fresh epoch from the checkpoint's weights" in message, "the fix"


def test_resume_of_a_fit_with_another_batch_size_is_refused_before_training(tmp_path: Path) -> None:
    source = make_identified_images(tmp_path / "src")
    ckpt = tmp_path / "preempted.ckpt"
    _fit(_datamodule(source, tmp_path / "cache"), Recorder(), 2, [PreemptAfter(3, ckpt)])
    model = Recorder()
    with pytest.raises(ValueError, match="batch_size=4 then, 5 now"):
        _fit(_datamodule(source, tmp_path / "cache", batch_size=5), model, 2, ckpt_path=ckpt)
    assert model.seen == [], "nothing trained on another split"


def test_a_checkpoint_at_the_end_of_an_epoch_resumes_with_another_batch_size(tmp_path: Path) -> None:
    source = make_identified_images(tmp_path / "src")
    ckpt = tmp_path / "epoch_end.ckpt"
    _fit(_datamodule(source, tmp_path / "cache"), Recorder(), 2, [PreemptAfter(-(-SAMPLES // 4), ckpt)])  # all of epoch 0
    model = Recorder()
    seen = _fit(_datamodule(source, tmp_path / "cache", batch_size=5), model, 2, ckpt_path=ckpt)
    assert [len(batch) for batch in seen] == [5] * (SAMPLES // 5), "epoch 1 whole, in batches of the new size; epoch 0 not repeated"
    assert sorted(i for batch in seen for i in batch) == list(range(SAMPLES))


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


# --- DDP: one launch checks exactly-once coverage, the block shuffle under DDP, and a DDP resume ----------------------

DDP_SAMPLES, DDP_BLOCK = 36, 2  # 18 blocks of 2 records: a window of 16 blocks, then 2; each rank a contiguous half
DDP_BATCHES = -(-DDP_SAMPLES // 2 // BATCH)  # 18 samples per rank: 5 batches per rank and epoch


def _ddp_run(source: Path, tmp_path: Path, name: str, block_bytes: int, *args: str) -> list[list[list[int]]]:
    """A 2-rank CPU DDP fit (``tests/scripts/ddp_resume.py``), block-shuffled; returns each rank's batches."""
    out = tmp_path / name
    command = [sys.executable, str(Path(__file__).parent / "scripts" / "ddp_resume.py"), str(source), str(tmp_path / "cache"),
               str(out), str(tmp_path / "ckpt"), "--block-bytes", str(block_bytes), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.slow
def test_two_rank_ddp_block_shuffle_resumed_with_workers_sees_each_sample_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped mid-way through epoch 2 with in-process loading, resumed with 2 persistent workers per rank.

    Covers in one DDP launch pair: each sample exactly once per epoch over the ranks, the block shuffle's order under
    DDP (each rank's contiguous slice, blocks from the database's size, block reads on), and a DDP resume with
    another ``num_workers``.
    """
    source = make_identified_images(tmp_path / "src", DDP_SAMPLES)
    built = _datamodule(source, tmp_path / "cache", shuffle="block")
    built.prepare_data()  # the DDP runs find it built
    block_bytes = os.stat(built.database_path("train")).st_size * DDP_BLOCK // DDP_SAMPLES
    monkeypatch.setattr(blockread, "BLOCK_BYTES", block_bytes)  # as the script sets it in each rank
    reference = _datamodule(source, tmp_path / "cache", shuffle="block")
    expected = [expected_batches(reference, 2, 2, rank, shuffle="block", block_size=DDP_BLOCK) for rank in range(2)]
    assert reference.datasets["train"].block_size == DDP_BLOCK
    stop_after = DDP_BATCHES + 2
    first = _ddp_run(source, tmp_path, "first", block_bytes, "--stop-after", str(stop_after), "--workers", "0")
    second = _ddp_run(source, tmp_path, "second", block_bytes, "--resume", "--workers", "2")
    for rank in range(2):
        assert len(first[rank]) == stop_after, f"rank {rank}"
        assert first[rank] + second[rank] == expected[rank], f"rank {rank}: the block order's contiguous slice, resumed where it stopped"
    for epoch in range(2):
        seen = [sum((first[r] + second[r])[epoch * DDP_BATCHES:(epoch + 1) * DDP_BATCHES], []) for r in range(2)]
        assert sorted(seen[0] + seen[1]) == list(range(DDP_SAMPLES)), f"epoch {epoch}: every sample exactly once over both ranks"
