"""Each option declared, defaulted and checked once: the CLI, the DataModule and the Hydra configs agree with it."""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
from pathlib import Path
from typing import get_args

import pytest
from hydra import compose, initialize_config_dir
from imagegen import make_jpegs
from omegaconf import OmegaConf

from lightning_lmdb import LMDBDataModule
from lightning_lmdb.codec import decoders
from lightning_lmdb.codec import storage as codec
from lightning_lmdb.datamodule.backends import BACKEND_CLASSES
from lightning_lmdb.datamodule.module import database_name
from lightning_lmdb.datamodule.options import BACKENDS, as_source_options
from lightning_lmdb.errors import OptionError
from lightning_lmdb.experiment.datamodule import ExperimentDataModule
from lightning_lmdb.options import CACHE_KEY_OPTIONS, CHOICES, BuildOptions, Storage
from lightning_lmdb.read import decoding, sampler
from lightning_lmdb.sources.base import SourceOptions
from lightning_lmdb.tools.cli import build_options, make_parser

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
#: The DataModule's arguments named otherwise in BuildOptions.
RENAMED = {"build_workers": "workers", "source_options": "manifest"}  # DataModule argument -> BuildOptions field
#: Where the experiment's configs deliberately differ from the DataModule's defaults, and why.
DELIBERATE = {
    "cache_dir": "the experiment's ${paths.cache_dir}, not the user's cache",
    "image_size": "64 for the small demo images, not 224",
    "num_workers": "loader/default.yaml's 2 workers, not one per core",
}


def _old_database_name(folder: Path, options: BuildOptions) -> str:
    """``database_name`` as it was written before the cache key moved to options.py (the names existing caches have)."""
    text = f"{folder}\0{options.storage}" + (f"\0resize={options.resize}\0quality={options.quality}" if options.resize else "")
    text += f"\0shards={options.shards}" if options.shards is not None else ""
    key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{folder.name}-{key}.lmdb"


@pytest.mark.parametrize("folder", [Path("/data/imagenet/train"), Path("/données/été"), Path("/odd/\udcff-bytes")])
@pytest.mark.parametrize("storage", ["encoded", "decoded"])
@pytest.mark.parametrize(("resize", "quality"), [(None, 90), (None, 80), (64, 90), (64, 80)])
@pytest.mark.parametrize("shards", [None, 4])
def test_database_names_are_unchanged(folder: Path, storage: str, resize: int | None, quality: int, shards: int | None) -> None:
    options = BuildOptions(storage=storage, resize=resize, quality=quality, shards=shards)  # type: ignore[arg-type]
    assert database_name(folder, options) == _old_database_name(folder, options), "a new name would orphan every cached database"


def test_only_the_cache_key_options_give_a_database_of_its_own() -> None:
    base = BuildOptions(resize=64, shards=4)
    other_values = {"storage": "decoded", "workers": 0, "on_error": "skip", "on_stale": "error", "overwrite": True, "max_pixels": 100,
                    "resize": 32, "quality": 80, "commit_every": 5, "progress": False, "shards": 2, "shard": 1,
                    "manifest": {"label_column": "tags"}, "validate": "header"}
    assert set(other_values) == {field.name for field in dataclasses.fields(BuildOptions)}, "a new option: say whether it is in the key"
    for name, value in other_values.items():
        changed = base.replace(**{name: value})
        assert (database_name(Path("/d"), changed) != database_name(Path("/d"), base)) == (name in CACHE_KEY_OPTIONS), name
    assert BuildOptions(quality=80).cache_key() == BuildOptions().cache_key(), "quality counts only when resizing"


def test_choices_are_declared_once() -> None:
    assert CHOICES["storage"] == codec.STORAGES == tuple(codec.STORAGE_MODES), "the storages the format accepts are the ones offered"
    assert get_args(Storage) == codec.STORAGES[:3], "the Literal documents the built-in modes, the registry's first three"
    assert set(BACKEND_CLASSES) == set(BACKENDS), "each backend value has its class"


def test_cli_and_datamodule_defaults_are_build_options(tmp_path: Path) -> None:
    assert build_options(make_parser().parse_args(["build", "src", "dst"])) == BuildOptions()
    parameters = inspect.signature(LMDBDataModule.__init__).parameters
    fields = {field.name for field in dataclasses.fields(BuildOptions)}
    shared = {name: RENAMED.get(name, name) for name in parameters if RENAMED.get(name, name) in fields}
    assert set(shared) == {"storage", "shards", "resize", "quality", "build_workers", "on_error", "on_stale", "max_pixels",
                           "source_options", "manifest", "validate"}  # manifest: source_options' deprecated name
    for name, field in shared.items():
        default = parameters[name].default
        # the DataModule's source_options default is None (plain hyper-parameters), which means BuildOptions' SourceOptions()
        assert (SourceOptions.of(default) if field == "manifest" else default) == getattr(BuildOptions, field), name
    dm = LMDBDataModule(make_jpegs(tmp_path / "src", 2, size=8), cache_dir=tmp_path / "cache")
    assert dm.build_options == BuildOptions()


def test_hydra_defaults_are_the_datamodule_defaults() -> None:
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        data = OmegaConf.to_container(compose("train").data, resolve=False)
    assert isinstance(data, dict) and data.pop("_target_") == "lightning_lmdb.experiment.datamodule.ExperimentDataModule"
    parameters = {**inspect.signature(LMDBDataModule.__init__).parameters, **inspect.signature(ExperimentDataModule.__init__).parameters}
    assert set(data) <= set(parameters), f"keys that are no argument: {set(data) - set(parameters)}"
    assert set(DELIBERATE) <= set(data)
    for name, value in data.items():
        if name in ("source_options", "manifest"):  # a node with every option unset (so that data.<name>.label_column=tags works)
            assert value == {field.name: None for field in dataclasses.fields(SourceOptions)}, value
            assert as_source_options(value) == SourceOptions.of(parameters[name].default)
        elif name not in DELIBERATE:
            assert value == parameters[name].default, f"data.{name}: {value!r} in the configs, {parameters[name].default!r} in __init__"


@pytest.mark.parametrize(
    ("argument", "message"),
    [
        ({"decoder": "fastest"}, "decoder='fastest' is not one of 'pil', 'torchcodec', 'opencv', 'auto' (Hydra: data.decoder=...)."),
        ({"shuffle": "blocks"}, "shuffle='blocks' is not one of True, False, 'block', None (None: 'block' when the training data does not "
                                "fit in memory, else True; Hydra: data.shuffle=...)."),
        ({"shuffle": 1}, "shuffle=1 is not one of True, False, 'block', None"),
        ({"backend": "lmbd"}, "backend='lmbd' is not one of 'lmdb', 'raw' (Hydra: data.backend=...)."),
        ({"decode_device": "gpu"}, "decode_device='gpu' is not one of 'cuda', 'cpu', None (Hydra: data.decode_device=...)."),
        ({"multiprocessing_context": "threads"},
         "multiprocessing_context='threads' is not one of 'fork', 'spawn', 'forkserver', None (Hydra: data.multiprocessing_context=...)."),
    ],
)
def test_a_bad_datamodule_choice_names_the_value_the_choices_and_the_hydra_key(tmp_path: Path, argument: dict, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        LMDBDataModule(tmp_path, **argument)
    assert str(raised.value).startswith(message)


def test_decoder_is_checked_by_one_function(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    message = "decoder='fastest' is not one of 'pil', 'torchcodec', 'opencv', 'auto'."
    for check in (lambda: decoding.check_decoding("fastest", None), lambda: decoders.decode(b"", "fastest")):
        with pytest.raises(ValueError) as raised:
            check()
        assert str(raised.value).startswith(message) and "register_decoder()" in str(raised.value)
    fastest = decoders.register_decoder(decoders.ImageDecoder("fastest", choose=lambda info: "opencv"))  # every caller accepts it
    try:
        decoding.check_decoding("fastest", None)
        source = make_jpegs(tmp_path / "src", 2, size=8)
        assert LMDBDataModule(source, decoder="fastest", cache_dir=tmp_path / "cache").decoder == "fastest"
    finally:
        decoders.unregister_decoder(fastest.name)
    with pytest.raises(ValueError, match="'fastest' is not one of"):
        decoding.check_decoding("fastest", None)


def test_shuffle_is_checked_by_one_function(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler, "SHUFFLES", (*sampler.SHUFFLES, "blocky"))  # a new order: every caller accepts it
    assert sampler.ResumableSampler(list(range(4)), shuffle="blocky").shuffle == "blocky"  # type: ignore[arg-type]
    source = make_jpegs(tmp_path / "src", 2, size=8)
    assert LMDBDataModule(source, shuffle="blocky", cache_dir=tmp_path / "cache").shuffle == "blocky"  # type: ignore[arg-type]


@pytest.mark.parametrize(("argument", "value", "shown"), [("build_workers", -1, "build_workers=-1"), ("quality", 0, "quality=0")])
def test_the_datamodules_bad_build_option_names_its_argument_and_hydra_key(tmp_path: Path, argument: str, value: int, shown: str) -> None:
    folder = make_jpegs(tmp_path / "src", 2, size=8)
    with pytest.raises(OptionError, match=rf"^{shown} .*\(Hydra: data\.{argument}=\.\.\.\)$"):
        LMDBDataModule(folder, cache_dir=tmp_path / "cache", **{argument: value})
