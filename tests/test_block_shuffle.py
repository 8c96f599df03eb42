"""Block shuffle: the sampler's order (exactly-once over the ranks, as DistributedSampler), block reads, the DataModule's choice.

Under 2-rank DDP, through the Trainer, and resumed mid-epoch: ``tests/test_resume.py``'s DDP test fits the DataModule block-shuffled.
"""

from __future__ import annotations

import itertools
import json
import mmap
import os
import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from ci import require
from imagegen import make_jpegs
from torch.utils.data import DataLoader, DistributedSampler

from lightning_lmdb import LMDBDataModule, build_lmdb
from lightning_lmdb.datamodule.module import choose_shuffle
from lightning_lmdb.read import blockread
from lightning_lmdb.read.dataset import LMDBImageDataset
from lightning_lmdb.read.sampler import DEFAULT_BLOCK_SIZE, ResumableDataLoader, ResumableSampler
from lightning_lmdb.read.transforms import eval_transform
from lightning_lmdb.store import database as databases
from lightning_lmdb.store import envs, shards
from lightning_lmdb.store import format as fmt
from lightning_lmdb.tools import pagecache as cache

# --- the order -------------------------------------------------------------------------------------------


def _ranks(size: int, replicas: int, **kwargs) -> list[list[int]]:
    """Every rank's order of epoch 0 of a ResumableSampler over ``range(size)``."""
    data = list(range(size))
    return [list(ResumableSampler(data, num_replicas=replicas, rank=r, **kwargs)) for r in range(replicas)]


COMBOS = list(itertools.product([1, 2, 7, 23, 64, 100, 257], [1, 2, 3, 4], [False, True], [1, 3, 8, 64, 1000], [1, 2, 16]))


@pytest.mark.parametrize(("size", "replicas", "drop_last"), sorted({c[:3] for c in COMBOS}))
def test_block_shuffle_is_distributed_samplers_multiset(size: int, replicas: int, drop_last: bool) -> None:
    for block_size, window in itertools.product([1, 3, 8, 64, 1000], [1, 2, 16]):
        case = f"size={size} replicas={replicas} drop_last={drop_last} block_size={block_size} window={window}"
        ranks = _ranks(size, replicas, shuffle="block", block_size=block_size, window=window, drop_last=drop_last, seed=11)
        reference = [list(DistributedSampler(list(range(size)), num_replicas=replicas, rank=r, shuffle=True, seed=11,
                                             drop_last=drop_last)) for r in range(replicas)]
        assert [len(r) for r in ranks] == [len(r) for r in reference], case
        seen, expected = Counter(sum(ranks, [])), Counter(sum(reference, []))
        assert sorted(seen.values()) == sorted(expected.values()), f"{case}: duplicates and drops counted as DistributedSampler's"
        order = ResumableSampler(list(range(size)), shuffle="block", block_size=block_size, window=window, seed=11).block_order()
        assert sorted(order.tolist()) == list(range(size)), case
        total = len(reference[0]) * replicas
        if drop_last:
            assert sum(ranks, []) == order[:total].tolist(), f"{case}: the tail of the order is dropped"
            assert max(seen.values(), default=1) == 1, case
        else:
            padded = order.tolist() * (total // max(1, size) + 1)
            assert sum(ranks, []) == padded[:total], f"{case}: padded by repeating the order from its start"
            if size % replicas == 0:
                assert seen == Counter(range(size)), f"{case}: every sample exactly once"


def _assert_groups_of_whole_blocks(order: list[int], size: int, block_size: int, window: int) -> None:
    """Blocks arrive in groups of ``window``: a group's blocks are all complete before the next group's first record."""
    remaining: dict[int, int] = {}
    started = 0
    for index in order:
        block = index // block_size
        if block not in remaining:
            if started == window:
                assert not remaining, f"a new group began with blocks {sorted(remaining)} unfinished"
                started = 0
            remaining[block] = min(size, (block + 1) * block_size) - block * block_size
            started += 1
        remaining[block] -= 1
        if remaining[block] == 0:
            del remaining[block]
    assert not remaining


@pytest.mark.parametrize(("size", "block_size", "window"), [(100, 1, 1), (100, 7, 1), (257, 8, 2), (1000, 10, 16), (64, 64, 16)])
def test_blocks_come_whole_in_groups_of_window(size: int, block_size: int, window: int) -> None:
    sampler = ResumableSampler(list(range(size)), shuffle="block", block_size=block_size, window=window, seed=3)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        order = sampler.block_order().tolist()
        _assert_groups_of_whole_blocks(order, size, block_size, window)
        position = 0
        while window == 1 and position < size:  # each block's records contiguous
            first = order[position] // block_size * block_size
            block = list(range(first, min(size, first + block_size)))
            assert sorted(order[position:position + len(block)]) == block
            position += len(block)


def test_block_order_is_a_pure_function_of_seed_and_epoch() -> None:
    data = list(range(500))
    a, b = (ResumableSampler(data, shuffle="block", block_size=10, window=4, seed=7) for _ in range(2))
    a.set_epoch(2), b.set_epoch(2)
    assert list(a) == list(b) and list(a) == list(a)
    b.set_epoch(3)
    assert list(b) != list(a), "a new order every epoch"
    c = ResumableSampler(data, shuffle="block", block_size=10, window=4, seed=8)
    c.set_epoch(2)
    assert list(c) != list(a), "another seed, another order"
    order = a.block_order().tolist()
    first_group = order[:40]
    assert first_group != sorted(first_group) and len({i // 10 for i in first_group}) == 4, "records mixed within the window"
    blocks_in_order = list(dict.fromkeys(i // 10 for i in order))
    assert blocks_in_order != sorted(blocks_in_order), "blocks in a random order"


def test_ranks_take_contiguous_slices_of_the_order() -> None:
    data = list(range(96))
    sampler = ResumableSampler(data, shuffle="block", block_size=8, window=2, seed=1)
    order = sampler.block_order().tolist()
    ranks = _ranks(96, 3, shuffle="block", block_size=8, window=2, seed=1)
    assert ranks == [order[0:32], order[32:64], order[64:96]]
    assert all(len({i // 8 for i in rank}) == 4 for rank in ranks), "with 32 = 2 windows of 16 records, each rank reads 4 whole blocks"


def test_exact_and_sequential_orders_are_distributed_samplers() -> None:
    data = list(range(23))
    for shuffle, drop_last, rank in itertools.product([True, False], [True, False], [0, 1, 2]):
        ours = ResumableSampler(data, shuffle=shuffle, seed=4, drop_last=drop_last, num_replicas=3, rank=rank)
        theirs = DistributedSampler(data, shuffle=shuffle, seed=4, drop_last=drop_last, num_replicas=3, rank=rank)
        ours.set_epoch(5), theirs.set_epoch(5)
        assert list(ours) == list(theirs)


def test_block_size_comes_from_the_dataset_when_it_has_one() -> None:
    class WithBlocks(list):
        block_size = 5

    assert ResumableSampler(WithBlocks(range(20)), shuffle="block").block_size == 5
    assert ResumableSampler(list(range(20)), shuffle="block").block_size == DEFAULT_BLOCK_SIZE == 64
    assert ResumableSampler(WithBlocks(range(20)), shuffle="block", block_size=3).block_size == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"shuffle": "blocks"}, "shuffle='blocks' is not one of True, False, 'block'"),
        ({"shuffle": None}, "shuffle=None is not one of True, False, 'block'"),
        ({"shuffle": 1}, "shuffle=1 is not one of"),
        ({"shuffle": "block", "block_size": 0}, "block_size=0 must be a positive integer"),
        ({"shuffle": "block", "block_size": 2.5}, "block_size=2.5 must be a positive integer"),
        ({"shuffle": "block", "window": 0}, "window=0 must be a positive integer"),
        ({"shuffle": "block", "window": True}, "window=True must be a positive integer"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ResumableSampler(list(range(10)), **kwargs)


def test_block_mode_resumes_with_the_remaining_samples() -> None:
    data = list(range(50))
    make = lambda: ResumableSampler(data, shuffle="block", block_size=4, window=3, seed=2, num_replicas=2, rank=1)  # noqa: E731
    sampler = make()
    sampler.set_epoch(3)
    order = list(sampler)
    loader = ResumableDataLoader(data, make(), batch_size=4)
    loader.sampler.set_epoch(3)
    it = iter(loader)
    first = [next(it).tolist() for _ in range(2)]
    state = json.loads(json.dumps(loader.state_dict()))
    assert state["shuffle"] == "block" and (state["block_size"], state["window"]) == (4, 3)
    again = ResumableDataLoader(data, make(), batch_size=4)
    again.sampler.set_epoch(3)
    again.load_state_dict(state)
    rest = [b.tolist() for b in again]
    assert sum(first + rest, []) == order, "the resumed epoch continues with exactly the samples that were next"
    other = ResumableDataLoader(data, ResumableSampler(data, shuffle="block", block_size=8, window=3, seed=2, num_replicas=2, rank=1),
                                batch_size=4)
    with pytest.raises(ValueError, match="block_size=4 then, 8 now"):
        other.load_state_dict(state)
    exact = ResumableDataLoader(data, ResumableSampler(data, seed=2, num_replicas=2, rank=1), batch_size=4)
    with pytest.raises(ValueError, match="shuffle='block' then, True now"):
        exact.load_state_dict(state)


# --- block reads -------------------------------------------------------------------------------------------

COUNT = 120


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """120 noise JPEGs of ~8 KB (each record spans pages), on a filesystem that honours eviction if there is one."""
    root = tmp_path_factory.mktemp("blocks")
    source = make_jpegs(root / "src", COUNT, size=64, classes=3)
    return build_lmdb(source, root / "db.lmdb", workers=0)


def _record_pages(path: Path, rows: range) -> list[np.ndarray]:
    """The file pages of each record of ``rows`` (addresses from the map, read in a transaction that touches only leaf pages)."""
    opened = envs.shared(path)
    start = next(int(line.split("-")[0], 16) for line in open("/proc/self/maps") if str(os.stat(path).st_ino) in line.split()[4:5])
    pages = []
    with opened.env.begin(buffers=True) as txn:
        for row in rows:
            value = txn.get(fmt.record_key(row), db=opened.records)
            offset = np.frombuffer(value, np.uint8).__array_interface__["data"][0] - start
            pages.append(np.arange(offset // mmap.PAGESIZE, (offset + len(value) - 1) // mmap.PAGESIZE + 1))
    return pages


def _record_bytes(path: Path, rows: range) -> int:
    opened = envs.shared(path)
    with opened.env.begin(buffers=True) as txn:
        return sum(len(txn.get(fmt.record_key(row), db=opened.records)) for row in rows)


def _samples(dataset: LMDBImageDataset, order: list[int], workers: int = 0) -> list[tuple[torch.Tensor, int]]:
    loader = DataLoader(dataset, batch_size=None, sampler=order, num_workers=workers)
    return [(image, int(target)) for image, target in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_samples_are_identical_with_block_reads_on_and_off(database: Path, workers: int) -> None:
    plain = LMDBImageDataset(database, transform=eval_transform(8), readahead=False)
    blocked = LMDBImageDataset(database, transform=eval_transform(8), readahead=False).read_blocks(True, block_size=8)
    train, _ = blocked.split(0.2, seed=1, transforms=(eval_transform(8), None))
    plain_train, _ = plain.split(0.2, seed=1, transforms=(eval_transform(8), None))
    order = list(ResumableSampler(train, shuffle="block", seed=5))
    assert train.block_size == 8 and ResumableSampler(train, shuffle="block").block_size == 8, "the sampler's blocks are the blocks read"
    blockread.reset_counters()
    for (a, ya), (b, yb) in zip(_samples(train, order, workers), _samples(plain_train, order, workers), strict=True):
        assert torch.equal(a, b) and ya == yb
    if workers == 0:
        assert blockread.counters().blocks_read == -(-len(train) // 8), "each block of the view read once"
    assert plain.read_blocks(False)._block_reads is None and blocked.read_blocks(False)._block_reads is None


def test_a_block_is_read_once_until_it_leaves_the_lru(database: Path) -> None:
    dataset = LMDBImageDataset(database, readahead=False).read_blocks(True, block_size=2)
    blockread.reset_counters()
    dataset[-1], dataset[0], dataset[1], dataset[0]
    counted = blockread.counters()
    assert (counted.blocks_read, counted.blocks_skipped) == (2, 0), "the last block and block 0, once each"
    assert counted.bytes_read >= _record_bytes(database, range(2)) + _record_bytes(database, range(COUNT - 2, COUNT))
    remember = blockread.REMEMBERED_BLOCKS
    assert COUNT // 2 > remember + 1
    for block in range(1, remember):  # 31 other blocks: with the last one and block 0, 33 -- one too many
        dataset[2 * block]
    reads = blockread.counters().blocks_read
    dataset[1]
    assert blockread.counters().blocks_read == reads, "block 0 is among the last 32"
    dataset[COUNT - 2]
    assert blockread.counters().blocks_read == reads + 1, "the last block dropped out of the LRU: read again"


def test_an_implausible_span_is_not_read(database: Path) -> None:
    scattered = LMDBImageDataset(database, indices=np.random.default_rng(0).permutation(COUNT)).read_blocks(True, block_size=8)
    in_order = LMDBImageDataset(database, indices=list(range(0, COUNT, 2))).read_blocks(True, block_size=8)  # every other record: 2x
    blockread.reset_counters()
    scattered[0], in_order[0]
    counted = blockread.counters()
    assert (counted.blocks_read, counted.blocks_skipped) == (1, 1)


def test_block_reads_pickle_as_settings_and_fork_starts_fresh(database: Path) -> None:
    dataset = LMDBImageDataset(database).read_blocks(True, block_size=6)
    dataset[0]
    copy = pickle.loads(pickle.dumps(dataset))
    assert copy._block_reads == blockread.BlockReads(6) and copy not in blockread._READERS
    assert dataset in blockread._READERS
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no reader inherited, counters from zero
        os.write(write, b"1" if dataset not in blockread._READERS and blockread.counters().blocks_read == 0 else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
    with pytest.raises(ValueError, match="block_size=0 must be a positive integer"):
        dataset.read_blocks(True, block_size=0)


def test_records_are_located_from_their_leaf_nodes_without_reading_them(database: Path) -> None:
    opened = envs.shared(database)
    start = next(int(line.split("-")[0], 16) for line in open("/proc/self/maps") if str(os.stat(database).st_ino) in line.split()[4:5])
    psize = opened.env.stat()["psize"]
    with opened.env.begin(buffers=True) as txn:
        values = [txn.get(fmt.record_key(row), db=opened.records) for row in range(COUNT)]
        truth = [(np.frombuffer(v, np.uint8).__array_interface__["data"][0] - start, len(v)) for v in values]
        cursor = txn.cursor(db=opened.records)
        located = [blockread._locate(cursor, row, psize, os.stat(database).st_size) for row in range(COUNT)]
    assert located == truth, "offset and size of every record, as the memory map has them"
    if not _evicted(database):
        require(False, f"{database} stays cached after posix_fadvise(DONTNEED) (tmpfs or a network filesystem?)")
    pages = _record_pages(database, range(COUNT))
    assert _evicted(database)
    opened = envs.shared(database, readahead=False)
    span = blockread._span(opened, np.arange(40, 48), COUNT)
    assert span == (truth[40][0] // mmap.PAGESIZE * mmap.PAGESIZE, -(-(truth[47][0] + truth[47][1]) // mmap.PAGESIZE) * mmap.PAGESIZE
                    - truth[40][0] // mmap.PAGESIZE * mmap.PAGESIZE)
    resident = cache.resident_pages(database)
    assert not any(resident[pages[r]].any() for r in range(41, 47)), "locating the ends of a block reads none of its other records"


def _evicted(path: Path) -> bool:
    envs.close_all()
    cache.evict([path], sync=True)
    return cache.resident_fraction(path) < 0.05


def test_reading_one_record_leaves_its_whole_block_cached(database: Path) -> None:
    if not _evicted(database):
        require(False, f"{database} stays cached after posix_fadvise(DONTNEED) (tmpfs or a network filesystem?)")
    size = 8
    pages = _record_pages(database, range(COUNT))
    block, far = 4, 10  # the block read, and one never touched (both away from the pages an open reads)
    plain = LMDBImageDataset(database, readahead=False)
    blocked = LMDBImageDataset(database, readahead=False).read_blocks(True, block_size=size)
    # without block reads (readahead off): only the record's own pages are read
    assert _evicted(database)
    plain[block * size]
    resident = cache.resident_pages(database)
    assert resident[pages[block * size]].all()
    assert not any(resident[pages[r]].all() for r in range(block * size + 1, (block + 1) * size)), "readahead off reads one record"
    # with block reads: the whole block, and still nothing of a far block
    assert _evicted(database)
    blocked[block * size + 3]
    resident = cache.resident_pages(database)
    assert all(resident[pages[r]].all() for r in range(block * size, (block + 1) * size)), "every record of the block is cached"
    assert not any(resident[pages[r]].any() for r in range(far * size, (far + 1) * size)), "another block is not"


def test_block_reads_of_a_sharded_database_read_each_shards_part(database: Path, tmp_path: Path) -> None:
    source = Path(databases.load_meta(database).source.root)
    folder = build_lmdb(source, tmp_path / "sharded.lmdb", shards=3, workers=0)
    files = shards.database_files(folder)
    plain = LMDBImageDataset(database, transform=eval_transform(8), readahead=False)
    blocked = LMDBImageDataset(folder, transform=eval_transform(8), readahead=False).read_blocks(True, block_size=30)
    order = list(ResumableSampler(blocked, shuffle="block", seed=3, window=2))
    blockread.reset_counters()
    for (a, ya), (b, yb) in zip(_samples(blocked, order), _samples(plain, order), strict=True):
        assert torch.equal(a, b) and ya == yb
    # 120 records in shards of 40: blocks of 30 end at 30, 60, 90, 120; the blocks at 30-59 and 60-89 span two shards
    assert blockread.counters().blocks_read == 6, "one read per shard part of each block"
    wanted = {files[0]: range(30, 40), files[1]: range(0, 20), files[2]: range(15, 40)}  # the block read; another, never touched
    pages = {file: _record_pages(file, rows) for file, rows in wanted.items()}  # before eviction: locating them reads them
    envs.close_all()
    cache.evict(files, sync=True)
    if max(cache.resident_fraction(f) for f in files) > 0.05:
        require(False, "eviction is not honoured on this filesystem (tmpfs or a network filesystem?)")
    blocked = LMDBImageDataset(folder, readahead=False).read_blocks(True, block_size=30)
    blocked[45]  # block 1: records 30-59, shard 0's last 10 and shard 1's first 20
    envs.close_all()
    resident = {file: cache.resident_pages(file) for file in files}
    for file in files[:2]:
        assert all(resident[file][p].all() for p in pages[file]), f"{file.name}: the block's records are cached"
    assert not any(resident[files[2]][p].any() for p in pages[files[2]]), "a block never touched is not"


# --- the DataModule ---------------------------------------------------------------------------------------


def test_choose_shuffle() -> None:
    assert choose_shuffle(10, 100) is True
    assert choose_shuffle(100, 100) == "block" and choose_shuffle(10**12, 8 * 2**30) == "block"


@pytest.mark.parametrize("backend", ["lmdb", "raw"])
def test_datamodule_chooses_block_shuffle_when_the_data_does_not_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     backend: str) -> None:
    source = make_jpegs(tmp_path / "src", 30, size=16)
    common = dict(cache_dir=tmp_path / "cache", backend=backend, build_workers=0, num_workers=0, batch_size=4,
                  train_transform=eval_transform(8), eval_transform=eval_transform(8))
    LMDBDataModule(source, **{**common, "backend": "lmdb"}).prepare_data()  # the raw backend then serves its list and blocks
    dm = LMDBDataModule(source, **common)
    dm.setup("fit")
    assert dm.shuffle is None and dm.train_shuffle is True and dm.train_dataloader().sampler.shuffle is True, "fits: exact shuffle"
    monkeypatch.setattr("lightning_lmdb.datamodule.module.available_memory", lambda: 1000)  # smaller than any database
    for shuffle, readahead in ((None, None), ("block", None), ("block", True)):
        dm = LMDBDataModule(source, shuffle=shuffle, readahead=readahead, **common)
        dm.setup("fit")
        sampler = dm.train_dataloader().sampler
        train, val = dm.datasets["train"], dm.datasets["val"]
        assert dm.train_shuffle == sampler.shuffle == "block"
        database_blocks = LMDBImageDataset(dm.database_path("train")).block_size
        assert sampler.block_size == database_blocks, "the same blocks for both backends"
        if backend == "lmdb":
            assert train._block_reads == blockread.BlockReads(database_blocks) and val._block_reads is None
            assert train.readahead is (False if readahead is None else readahead), "block shuffle: readahead off unless set"
            assert val.readahead is True, "validation keeps the automatic choice (the file really fits here)"
        assert sum(len(targets) for _, targets in dm.train_dataloader()) == len(train)
    dm = LMDBDataModule(source, shuffle=True, **common)
    dm.setup("fit")
    assert dm.train_shuffle is True and getattr(dm.datasets["train"], "_block_reads", None) is None, "an explicit True is kept"
    with pytest.raises(ValueError, match="shuffle='blocks' is not one of True, False, 'block', None"):
        LMDBDataModule(source, shuffle="blocks", **common)

