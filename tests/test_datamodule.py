"""LMDBDataModule from plain Python, under DDP, and through every Hydra data config."""

from __future__ import annotations

import inspect
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from ci import require
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from imagegen import make_jpegs
from omegaconf import OmegaConf

from lightning_lmdb import LMDBDataModule
from lightning_lmdb.datamodule import backends as dm_module  # the LMDB backend's builds
from lightning_lmdb.datamodule.module import DEFAULT_VAL_FRACTION
from lightning_lmdb.experiment.datamodule import ExperimentDataModule
from lightning_lmdb.read.dataset import LMDBImageDataset
from lightning_lmdb.read.raw import RawImageDataset
from lightning_lmdb.read.transforms import ResizedCrop, eval_transform
from lightning_lmdb.store import envs, shards

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


class TinyClassifier(pl.LightningModule):
    def __init__(self, num_classes: int, size: int = 8):
        super().__init__()
        self.layer = torch.nn.Linear(3 * size * size, num_classes)

    def training_step(self, batch, batch_idx):
        images, targets = batch
        return torch.nn.functional.cross_entropy(self.layer(images.flatten(1)), targets)

    def validation_step(self, batch, batch_idx):
        images, targets = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.layer(images.flatten(1)), targets))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_plain_python_fit_with_validation_split(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 40, size=16, classes=3)
    dm = LMDBDataModule(source, val_fraction=0.25, cache_dir=tmp_path / "cache", batch_size=8, num_workers=2,
                        train_transform=eval_transform(8), eval_transform=eval_transform(8), build_workers=0)
    before = dict(vars(dm))
    dm.prepare_data()
    assert vars(dm) == before, "prepare_data must not set state"
    assert dm.database_path("train").exists()
    dm.setup("fit")
    assert envs.open_paths() == [], "the main process holds no environment after setup"
    train, val = dm.datasets["train"], dm.datasets["val"]
    assert isinstance(train, LMDBImageDataset) and len(train) == 30 and len(val) == 10
    assert sorted(train.paths + val.paths) == sorted(LMDBImageDataset(dm.database_path("train")).paths)
    assert dm.num_classes == 3
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(TinyClassifier(3), datamodule=dm)
    assert trainer.state.finished and "val_loss" in trainer.callback_metrics
    assert LMDBDataModule(source, val_fraction=0.25, cache_dir=tmp_path / "cache").database_path("train") == dm.database_path("train")


def test_raw_and_lmdb_backends_serve_identical_batches(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 12, size=16)
    batches = {}
    for backend in ("lmdb", "raw"):
        dm = LMDBDataModule(source, test_dir=source, backend=backend, cache_dir=tmp_path / "cache", batch_size=5,
                            num_workers=0, eval_transform=eval_transform(8), build_workers=0)
        dm.prepare_data()
        dm.setup("test")
        assert isinstance(dm.datasets["test"], RawImageDataset if backend == "raw" else LMDBImageDataset)
        batches[backend] = list(dm.test_dataloader())
    assert not (tmp_path / "cache").exists() or len(list((tmp_path / "cache").glob("*.lmdb"))) == 1
    for (xa, ya), (xb, yb) in zip(batches["lmdb"], batches["raw"], strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_loader_settings(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 8, size=16)
    common = {"cache_dir": tmp_path / "c", "backend": "raw", "batch_size": 3, "drop_last": True}
    dm = LMDBDataModule(source, val_dir=source, num_workers=0, **common)
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.num_workers == 0 and loader.prefetch_factor is None and not loader.persistent_workers
    assert loader.drop_last and not dm.val_dataloader().drop_last
    dm = LMDBDataModule(source, val_dir=source, num_workers=2, prefetch_factor=3, multiprocessing_context="spawn", **common)
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert (loader.prefetch_factor, loader.persistent_workers) == (3, True)
    with pytest.raises(RuntimeError, match="No test data"):
        dm.test_dataloader()
    with pytest.raises(ValueError, match="backend='nfs'"):
        LMDBDataModule(source, backend="nfs")
    # shared storage still prepares on every node: each node builds its own part (the shared_filesystem tests below)
    assert LMDBDataModule(source, shared_filesystem=True).prepare_data_per_node is True


def _listing(folder: Path) -> dict[str, tuple[int, int, int]]:
    """Every file of ``folder`` with its inode, size and modification time: what a rebuild or a write would change."""
    return {p.name: (p.stat().st_ino, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}


def test_shared_filesystem_without_shards_node_zero_builds_the_file_and_node_one_reads_it(tmp_path: Path,
                                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Two nodes' local rank 0 call ``prepare_data`` on one shared ``cache_dir``, as Lightning does with ``prepare_data_per_node``.

    Each module gets the node rank of a 2-node job the way Lightning gives it (``trainer.node_rank``, ``trainer.num_nodes``).
    """
    source = make_jpegs(tmp_path / "src", 12, size=16)
    shared = tmp_path / "shared-cache"
    settings = dict(cache_dir=shared, shared_filesystem=True, build_workers=0, num_workers=0, batch_size=4, val_fraction=0.25,
                    shuffle=False, train_transform=eval_transform(8), eval_transform=eval_transform(8))
    nodes = [LMDBDataModule(source, **settings) for _ in range(2)]
    built: list[int] = []  # the node of each build_lmdb call
    calling = threading.local()
    build_lmdb = dm_module.build_lmdb

    def recording_build_lmdb(source, target, options):
        built.append(calling.node)
        return build_lmdb(source, target, options)

    monkeypatch.setattr(dm_module, "build_lmdb", recording_build_lmdb)
    for rank, dm in enumerate(nodes):
        dm.trainer = SimpleNamespace(node_rank=rank, num_nodes=2)
    database = nodes[0].database_path("train")
    assert nodes[1].database_path("train") == database, "both nodes name the same database"

    def prepare(rank: int) -> None:
        calling.node = rank
        nodes[rank].prepare_data()

    prepare(1)  # node 1 alone (node 0 not started yet): it builds nothing and writes nothing; it waits at Lightning's barrier
    assert built == [] and not database.exists() and (not shared.exists() or not any(shared.iterdir()))
    threads = [threading.Thread(target=prepare, args=(rank,)) for rank in (1, 0)]  # both nodes at once
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert built == [0], "node 0 builds the one file, node 1 never"
    assert database.is_file() and [p.name for p in shared.glob("*.lmdb")] == [database.name]
    before = _listing(shared)
    for rank in (1, 0):  # a node that prepares again (a restart) keeps the database as it is
        prepare(rank)
    assert built == [0, 0] and _listing(shared) == before, "the database was rebuilt or written to"

    batches = []
    for dm in nodes:
        dm.trainer = None  # setup as after Lightning's barrier, outside a job
        dm.setup("fit")
        assert dm.datasets["train"].path == str(database)
        batches.append([batch for split in ("train", "val") for batch in getattr(dm, f"{split}_dataloader")()])
    assert len(batches[0]) == len(batches[1]) == 3 + 1
    for (x0, y0), (x1, y1) in zip(*batches, strict=True):
        assert torch.equal(x0, x1) and torch.equal(y0, y1), "both nodes read identical samples"


@pytest.mark.parametrize("shard_count", [None, 2])
def test_shared_filesystem_with_local_copies_stages_after_the_barrier(tmp_path: Path, shard_count: int | None) -> None:
    """With ``local_cache_dir`` a node that is not building stages nothing in ``prepare_data`` (node 0 may still be building);
    each node copies the finished databases in ``setup``, after Lightning's barrier, and reads its own copy."""
    source = make_jpegs(tmp_path / "src", 8, size=16)
    settings = dict(cache_dir=tmp_path / "shared", shared_filesystem=True, build_workers=0, num_workers=0, batch_size=4,
                    val_fraction=0, shuffle=False, shards=shard_count, train_transform=eval_transform(8))
    nodes = [LMDBDataModule(source, local_cache_dir=tmp_path / f"local{rank}", **settings) for rank in range(2)]
    for rank, dm in enumerate(nodes):
        dm.trainer = SimpleNamespace(node_rank=rank, num_nodes=2)
    nodes[1].prepare_data()  # node 0 has not built yet: before the fix, a FileNotFoundError or a missing-manifest error
    assert not (tmp_path / "local1").exists() or not any((tmp_path / "local1").iterdir()), "nothing staged before the barrier"
    nodes[0].prepare_data()
    if shard_count:
        nodes[1].prepare_data()  # each node builds its own shards
    batches = []
    for rank, dm in enumerate(nodes):
        dm.setup("fit")  # after the barrier
        assert Path(dm.datasets["train"].path).is_relative_to(tmp_path / f"local{rank}"), "each node reads its own local copy"
        batches.append(list(dm.train_dataloader()))
    assert len(batches[0]) == 2
    for (x0, y0), (x1, y1) in zip(*batches, strict=True):
        assert torch.equal(x0, x1) and torch.equal(y0, y1)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.slow
def test_two_node_ddp_serves_each_sample_once_per_epoch_from_every_layout(tmp_path: Path) -> None:
    """One DDP launch (two simulated nodes of one CPU process each, gloo, a shared cache) fits three DataModules in turn.

    Each with ``shared_filesystem=True``, the default ``shuffle=None`` (rank 0's choice, broadcast) and a loader worker per
    rank: one LMDB file (built by node 0 alone), a sharded database (each node builds its shards) and the raw backend.
    """
    source = make_jpegs(tmp_path / "src", 40, size=16, classes=3)
    cache, out = tmp_path / "shared-cache", tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    script = Path(__file__).parent / "scripts" / "ddp_two_nodes.py"
    procs = [subprocess.Popen([sys.executable, str(script), str(source), str(cache), str(out)], env={**env, "NODE_RANK": str(node)},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
    try:
        logs = [p.communicate(timeout=280)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(log[-3000:] for log in logs)
    runs = {case: [json.loads((out / f"{case}_node{node}.json").read_text()) for node in (0, 1)] for case in ("single", "sharded", "raw")}
    train_size = 40 - 4  # no val_dir: the default val_fraction (0.1) holds 4 of the 40 out
    for case, nodes in runs.items():
        assert nodes[0]["database"] == nodes[1]["database"], f"{case}: both nodes read the same database"
        for epoch in range(2):
            ranks = [node["epochs"][epoch] for node in nodes]
            assert len(ranks[0]) == len(ranks[1]) == train_size // 2, f"{case}: the distributed sampler splits the data evenly"
            assert sorted(ranks[0] + ranks[1]) == list(range(train_size)), f"{case}, epoch {epoch}: every sample exactly once"
        assert nodes[0]["epochs"][0] != nodes[0]["epochs"][1], f"{case}: shuffling changes between epochs"
    single, sharded, raw = runs["single"], runs["sharded"], runs["raw"]
    assert [node["build_lmdb"] for node in single] == [[single[0]["database"]], []], "node 0 builds the one file, node 1 none"
    assert [node["build_shards"] for node in sharded] == [[[0, 2]], [[1, 3]]], "each node builds its shards: i % 2 == node"
    assert [node["build_lmdb"] + node["build_shards"] for node in raw + single[1:]] == [[], [], []]
    assert raw[0]["database"] is None
    folder = Path(sharded[0]["database"])
    assert (folder / "manifest.json").exists() and len(shards.database_files(folder)) == 4
    one, many = LMDBImageDataset(single[0]["database"]), LMDBImageDataset(folder)
    assert (one.paths, one.targets) == (many.paths, many.targets), "the nodes' shards make the samples of one file"
    assert all(np.array_equal(np.asarray(one[i][0]), np.asarray(many[i][0])) for i in range(len(one)))


@pytest.mark.filterwarnings("ignore:This DataLoader will create 8 worker processes")  # loader=fast's; none is started here
@pytest.mark.parametrize("data", ["lmdb", "raw"])
@pytest.mark.parametrize("transforms", ["default", "eval_only"])
@pytest.mark.parametrize("loader", ["default", "fast", "debug"])
def test_every_data_config_composes_and_instantiates(tmp_path: Path, data: str, transforms: str, loader: str) -> None:
    """Each combination makes the DataModule, model, transforms and loader settings it names; no worker is started.

    Batches through worker processes are fitted by tests/test_train.py (``test_fast_dev_run_through_compose``).
    """
    source = make_jpegs(tmp_path / "src", 6, size=16)
    overrides = [f"data={data}", f"transforms={transforms}", f"loader={loader}", f"data.train_dir={source}", f"paths.data_dir={tmp_path}",
                 "data.build_workers=0"]
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    dm = instantiate(cfg.data)
    assert isinstance(dm, LMDBDataModule) and dm.backend == data
    assert dm.cache_dir == tmp_path / "lmdb"
    assert dm.batch_size == cfg.data.batch_size and dm.num_workers == cfg.data.num_workers
    size = cfg.data.image_size
    assert dm.train_transform == ResizedCrop(size, train=transforms == "default") and dm.eval_transform == ResizedCrop(size, train=False)
    model = instantiate(cfg.model, num_classes=dm.num_classes)
    assert isinstance(model, pl.LightningModule) and model.hparams.num_classes == 2
    dm.prepare_data()
    dm.setup("fit")
    assert isinstance(dm.datasets["train"], LMDBImageDataset if data == "lmdb" else RawImageDataset)
    train_loader = dm.train_dataloader()  # its workers start when it is iterated
    workers = cfg.data.num_workers > 0
    assert (train_loader.batch_size, train_loader.num_workers, train_loader.prefetch_factor, train_loader.persistent_workers) == (
        cfg.data.batch_size, cfg.data.num_workers, cfg.data.prefetch_factor if workers else None, workers)
    image, target = dm.datasets["train"][0]
    assert image.shape == (3, size, size) and image.dtype == torch.uint8 and target in (0, 1)
    assert dm.finish((image[None], torch.tensor([target])))[0].dtype == torch.float32


def test_lmdb_and_raw_configs_differ_only_in_backend() -> None:
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        lmdb_cfg = OmegaConf.to_container(compose("train", overrides=["data=lmdb"]).data)
        raw_cfg = OmegaConf.to_container(compose("train", overrides=["data=raw"]).data)
    assert (lmdb_cfg.pop("backend"), raw_cfg.pop("backend")) == ("lmdb", "raw")
    assert lmdb_cfg == raw_cfg


def test_a_missing_folder_is_named_at_construction(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"train_dir '.*no_such_dir' does not exist.*data\.train_dir"):
        LMDBDataModule(tmp_path / "no_such_dir", cache_dir=tmp_path / "cache")
    source = make_jpegs(tmp_path / "src", 6, size=8)
    with pytest.raises(FileNotFoundError, match="test_dir"):
        LMDBDataModule(source, test_dir=tmp_path / "nope", cache_dir=tmp_path / "cache")
    with pytest.raises(FileNotFoundError, match="there is none at"):
        LMDBDataModule(tmp_path / "gone", cache_dir=tmp_path / "cache", on_stale="ignore")
    # with on_stale="ignore" an existing database is served without its folder
    dm = LMDBDataModule(source, cache_dir=tmp_path / "cache", build_workers=0, on_stale="ignore", num_workers=0)
    dm.prepare_data()
    moved = source.rename(tmp_path / "moved")
    dm2 = LMDBDataModule(source, cache_dir=tmp_path / "cache", on_stale="ignore", num_workers=0)
    assert dm2.classes == ["c0", "c1"], "before setup, from the database when the folder is gone"
    dm2.prepare_data()
    dm2.setup("fit")
    assert len(dm2.datasets["train"]) + len(dm2.datasets["val"]) == 6 and dm2.num_classes == 2
    assert moved.is_dir()


def test_predict_in_a_fresh_module_falls_back_to_the_validation_split(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 20, size=8)
    dm = LMDBDataModule(source, val_fraction=0.2, cache_dir=tmp_path / "cache", build_workers=0, num_workers=0, batch_size=4,
                        eval_transform=eval_transform(8))
    dm.prepare_data()
    dm.setup("predict")
    assert len(dm.predict_dataloader().dataset) == 4
    fresh = LMDBDataModule(source, cache_dir=tmp_path / "cache", build_workers=0, num_workers=0)
    fresh.setup("test")
    with pytest.raises(RuntimeError, match="No test data: pass test_dir"):
        fresh.test_dataloader()


@pytest.mark.parametrize("database_first", [True, False], ids=["database-exists", "no-database"])
def test_raw_backend_serves_exactly_the_samples_of_a_skip_build(tmp_path: Path, database_first: bool) -> None:
    from imagegen import truncated_jpeg

    source = make_jpegs(tmp_path / "src", 24, size=8, classes=2)
    (source / "c0" / "zz_broken.jpg").write_bytes(truncated_jpeg())
    (source / "c1" / "aa_empty.jpg").write_bytes(b"")
    kwargs = dict(val_fraction=0.25, cache_dir=tmp_path / "cache", build_workers=0, num_workers=0, on_error="skip",
                  train_transform=eval_transform(8), eval_transform=eval_transform(8), shuffle=False, batch_size=64)
    lmdb_dm, raw_dm = LMDBDataModule(source, backend="lmdb", **kwargs), LMDBDataModule(source, backend="raw", **kwargs)
    if database_first:
        lmdb_dm.prepare_data()
    raw_dm.prepare_data()
    assert lmdb_dm.database_path("train").exists() == database_first, "the raw backend's prepare_data builds nothing"
    raw_dm.setup("fit")
    lmdb_dm.prepare_data()
    lmdb_dm.setup("fit")
    for split in ("train", "val"):
        raw, lmdb_ds = raw_dm.datasets[split], lmdb_dm.datasets[split]
        assert isinstance(raw, RawImageDataset)
        assert raw.paths == lmdb_ds.paths and raw.targets == lmdb_ds.targets
        assert len(raw) == len(lmdb_ds)
    assert len(raw_dm.datasets["train"]) + len(raw_dm.datasets["val"]) == 24
    for (x_raw, y_raw), (x_lmdb, y_lmdb) in zip(raw_dm.train_dataloader(), lmdb_dm.train_dataloader(), strict=True):
        assert torch.equal(x_raw, x_lmdb) and torch.equal(y_raw, y_lmdb)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.backend=lmbd", "backend='lmbd' is not one of 'lmdb', 'raw'"),
        ("data.storage=jpg", "storage='jpg' is not one of 'auto', 'encoded', 'decoded'"),
        ("data.on_error=ignore", "on_error='ignore' is not one of 'raise', 'skip'"),
        ("data.on_stale=never", "on_stale='never' is not one of 'rebuild', 'error', 'ignore'"),
        ("data.multiprocessing_context=threads", "multiprocessing_context='threads' is not one of 'fork', 'spawn', 'forkserver', None"),
    ],
)
def test_hydra_instantiate_rejects_a_bad_choice_naming_the_valid_ones(tmp_path: Path, override: str, message: str) -> None:
    source = make_jpegs(tmp_path / "src", 2, size=8)
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[f"data.train_dir={source}", f"paths.data_dir={tmp_path}", override])
    with pytest.raises(Exception, match=message) as raised:  # Hydra wraps the ValueError in an InstantiationException
        instantiate(cfg.data)
    assert isinstance(raised.value.__cause__ or raised.value, ValueError)


def test_val_fraction_defaults_to_a_split_without_val_dir_and_none_with_one(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 20, size=8)
    common = {"cache_dir": tmp_path / "cache", "backend": "raw", "num_workers": 0}
    assert LMDBDataModule(source, **common).val_fraction == DEFAULT_VAL_FRACTION == 0.1
    assert LMDBDataModule(source, val_dir=source, **common).val_fraction == 0.0
    assert LMDBDataModule(test_dir=source, **common).val_fraction == 0.0, "nothing to split without train_dir"
    assert LMDBDataModule(source, val_fraction=0.25, **common).val_fraction == 0.25
    assert LMDBDataModule(source, val_dir=source, val_fraction=0, **common).val_fraction == 0.0
    dm = LMDBDataModule(source, **common)
    dm.setup("fit")
    assert (len(dm.datasets["train"]), len(dm.datasets["val"])) == (18, 2)
    dm = LMDBDataModule(source, val_fraction=0, **common)
    dm.setup("fit")
    assert len(dm.datasets["train"]) == 20 and "val" not in dm.datasets, "0 disables the split"
    with pytest.raises(ValueError, match=r"either val_dir or val_fraction.*val_fraction=0\.2"):
        LMDBDataModule(source, val_dir=source, val_fraction=0.2, **common)
    for bad in (1.0, -0.1, True, "0.1"):
        with pytest.raises(ValueError, match=f"val_fraction={bad!r} must be in"):
            LMDBDataModule(source, val_fraction=bad, **common)  # type: ignore[arg-type]
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[f"data.train_dir={source}", f"paths.data_dir={tmp_path}"])
    assert cfg.data.val_fraction is None and instantiate(cfg.data).val_fraction == 0.1
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[f"data.train_dir={source}", f"data.val_dir={source}", f"paths.data_dir={tmp_path}"])
    assert instantiate(cfg.data).val_fraction == 0.0, "the configs' default works with val_dir too"


def test_classes_and_class_to_idx(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 9, size=8, classes=3)
    dm = LMDBDataModule(source, cache_dir=tmp_path / "cache", build_workers=0, num_workers=0)
    expected = (["c0", "c1", "c2"], {"c0": 0, "c1": 1, "c2": 2})
    assert (dm.classes, dm.class_to_idx, dm.num_classes) == (*expected, 3), "before setup: from the class folders"
    dm.prepare_data()
    dm.setup("fit")
    assert (dm.classes, dm.class_to_idx) == expected == (dm.datasets["train"].classes, dm.datasets["train"].class_to_idx)
    dm.classes.append("mutated")
    assert dm.classes == expected[0], "a copy, not the dataset's own list"
    flat = make_jpegs(tmp_path / "flat_src", 4, size=8, classes=1)
    for image in list(flat.rglob("*.jpg")):
        image.rename(tmp_path / "flat_src" / image.name)
    (flat / "c0").rmdir()
    dm = LMDBDataModule(flat, backend="raw", cache_dir=tmp_path / "cache", num_workers=0)
    assert (dm.classes, dm.class_to_idx, dm.num_classes) == ([], {}, 0)
    dm.setup("fit")
    assert (dm.classes, dm.class_to_idx, dm.num_classes) == ([], {}, 0)


def _plain(value: object) -> bool:
    if type(value) in (tuple, list):
        return all(_plain(item) for item in value)
    return value is None or type(value) in (str, int, float, bool)


def test_checkpoint_hyperparameters_are_plain_and_load_weights_only(tmp_path: Path) -> None:
    source = make_jpegs(tmp_path / "src", 16, size=8)
    dm = LMDBDataModule(source, cache_dir=tmp_path / "cache", image_size=8, batch_size=4, build_workers=0, num_workers=0,
                        train_transform=eval_transform(8), eval_transform=eval_transform(8))
    given = {name for name in inspect.signature(LMDBDataModule.__init__).parameters if name != "self"}
    assert set(dm.hparams) == given - {"train_transform", "eval_transform", "storage_options"}, "storage_options: never saved"
    assert dm.hparams["train_dir"] == str(source) and dm.hparams["cache_dir"] == str(tmp_path / "cache")
    assert dm.hparams["val_fraction"] is None, "the arguments as given (automatic), not as resolved"
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=True, callbacks=[checkpoints],
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(TinyClassifier(2), datamodule=dm)
    ckpt = tmp_path / "ckpt" / "last.ckpt"
    loaded = torch.load(ckpt, weights_only=True)
    hparams = loaded[LMDBDataModule.CHECKPOINT_HYPER_PARAMS_KEY]
    assert hparams == dict(dm.hparams) and all(_plain(v) for v in hparams.values()), hparams
    restored = LMDBDataModule.load_from_checkpoint(ckpt, weights_only=True)
    assert isinstance(restored, LMDBDataModule) and restored.hparams == dm.hparams
    assert (restored.sources, restored.cache_dir, restored.val_fraction) == (dm.sources, dm.cache_dir, 0.1)
    assert LMDBDataModule.load_from_checkpoint(ckpt, batch_size=2).batch_size == 2, "keyword arguments override"
    # resuming (which loads the datamodule's state too) works with weights-only loading
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt2")
    trainer = pl.Trainer(accelerator="cpu", max_epochs=2, logger=False, callbacks=[checkpoints], enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(TinyClassifier(2), datamodule=restored, ckpt_path=ckpt, weights_only=True)
    assert trainer.current_epoch == 2 and trainer.state.finished


class BatchSizeClassifier(TinyClassifier):
    """A model with a ``batch_size`` hyper-parameter of its own (as lightning-hydra-template's are), logged by the logger."""

    def __init__(self, num_classes: int, batch_size: int = 32):
        super().__init__(num_classes)
        self.save_hyperparameters(logger=True)


@pytest.mark.parametrize("module", [LMDBDataModule, ExperimentDataModule])
def test_the_loggers_hparams_are_the_models_and_the_checkpoint_keeps_the_datamodules(tmp_path: Path, module: type) -> None:
    source = make_jpegs(tmp_path / "src", 8, size=8)
    dm = module(source, cache_dir=tmp_path / "cache", image_size=8, batch_size=4, build_workers=0, num_workers=0, val_fraction=0,
                train_transform=eval_transform(8), eval_transform=eval_transform(8))
    logger = pl.loggers.CSVLogger(tmp_path / "logs", name="run", version=0)
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=logger, callbacks=[checkpoints], enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(BatchSizeClassifier(2), datamodule=dm)  # a logged datamodule's batch_size=4 would clash with the model's 32
    logged = OmegaConf.to_container(OmegaConf.load(tmp_path / "logs" / "run" / "version_0" / "hparams.yaml"))
    assert logged == {"num_classes": 2, "batch_size": 32}, "the model's alone"
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)[LMDBDataModule.CHECKPOINT_HYPER_PARAMS_KEY]
    assert saved == dict(dm.hparams) and saved["batch_size"] == 4 and saved["train_dir"] == str(source)


class SampleCounter(TinyClassifier):
    """Counts the training samples it sees and the validation steps it runs."""

    def __init__(self, num_classes: int):
        super().__init__(num_classes)
        self.trained_on, self.validation_steps = 0, 0

    def training_step(self, batch, batch_idx):
        self.trained_on += len(batch[1])
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.validation_steps += 1


@pytest.mark.parametrize("backend", ["lmdb", "raw"])
def test_val_fraction_zero_trains_on_every_image_without_validation(tmp_path: Path, backend: str) -> None:
    source = make_jpegs(tmp_path / "src", 10, size=16)
    dm = LMDBDataModule(source, val_fraction=0, backend=backend, cache_dir=tmp_path / "cache", batch_size=4, num_workers=0,
                        build_workers=0, train_transform=eval_transform(8))
    model = SampleCounter(2)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)  # with Lightning's default sanity check, which asks for validation data too
    trainer.fit(model, datamodule=dm)
    assert trainer.state.finished and model.trained_on == 2 * 10, "every image, every epoch"
    assert model.validation_steps == 0 and dm.val_dataloader() == []


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("batch_size", "abc", "batch_size='abc' must be an integer >= 1"),
        ("batch_size", 0, "batch_size=0 must be an integer >= 1"),
        ("num_workers", -1, "num_workers=-1 must be an integer >= 0"),
        ("num_workers", "2", "num_workers='2' must be an integer >= 0"),
        ("image_size", 0, "image_size=0 must be an integer >= 1"),
        ("image_size", True, "image_size=True must be an integer >= 1"),
        ("prefetch_factor", 0, "prefetch_factor=0 must be an integer >= 1"),
    ],
)
def test_loader_numbers_are_refused_at_construction(tmp_path: Path, option: str, value: object, message: str) -> None:
    source = make_jpegs(tmp_path / "src", 2, size=8)
    with pytest.raises(ValueError, match=rf"^{message} \(.*Hydra: data\.{option}="):
        LMDBDataModule(source, cache_dir=tmp_path / "cache", **{option: value})


@pytest.mark.parametrize("split", ["train_dir", "val_dir", "test_dir"])
def test_a_folder_without_images_is_refused_at_construction(tmp_path: Path, split: str) -> None:
    source = make_jpegs(tmp_path / "src", 4, size=8)
    empty = tmp_path / "empty"
    (empty / "class_a").mkdir(parents=True)  # class folders, but no image in any of them
    (empty / "notes.txt").write_text("not an image")
    dirs = {"train_dir": source, split: empty}
    with pytest.raises(ValueError, match=rf"No images found in {split} '.*empty'.*Hydra: data\.{split}="):
        LMDBDataModule(**dirs, cache_dir=tmp_path / "cache")


def test_on_stale_ignore_checks_for_images_at_prepare_data_not_construction(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    dm = LMDBDataModule(tmp_path / "empty", cache_dir=tmp_path / "cache", on_stale="ignore", build_workers=0)  # promises no scan
    with pytest.raises(ValueError, match="No images found in .*empty"):
        dm.prepare_data()


@pytest.fixture
def read_only_dir(tmp_path: Path):
    """An existing folder on a read-only file system (behind a netfs mount: writes fail with EROFS, even for root)."""
    from lightning_lmdb.tools import netfs

    try:
        netfs.check_available()
    except netfs.NetfsUnavailableError as exc:
        require(False, f"FUSE unavailable (the read-only file system here is a latency mount): {exc}")
    (tmp_path / "ro_src").mkdir()
    with netfs.mounted(tmp_path / "ro_src", tmp_path / "ro", latency_ms=0) as mount:
        yield mount.path


@pytest.mark.slow
@pytest.mark.parametrize("below", [False, True], ids=["the-folder", "a-folder-to-create-in-it"])
def test_a_read_only_cache_dir_is_named_with_the_fix(tmp_path: Path, read_only_dir: Path, below: bool) -> None:
    from lightning_lmdb.datamodule.module import CacheDirError

    cache_dir = read_only_dir / "sub" / "cache" if below else read_only_dir
    dm = LMDBDataModule(make_jpegs(tmp_path / "src", 4, size=8), cache_dir=cache_dir, build_workers=0)
    with pytest.raises(CacheDirError, match=rf"cache_dir '{cache_dir}' is not writable \(a read-only file system.*data\.cache_dir="):
        dm.prepare_data()
