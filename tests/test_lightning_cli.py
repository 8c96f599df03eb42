"""LMDBDataModule under LightningCLI (jsonargparse): its arguments, a YAML config, and choices checked at parse time."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml
from imagegen import make_jpegs
from lightning.pytorch.cli import LightningCLI

from lightning_lmdb import LMDBDataModule


class TinyModel(pl.LightningModule):
    """The smallest model LightningCLI accepts."""

    def __init__(self, num_classes: int = 2, size: int = 8):
        super().__init__()
        self.layer = torch.nn.Linear(3 * size * size, num_classes)

    def training_step(self, batch, batch_idx):
        images, targets = batch
        return torch.nn.functional.cross_entropy(self.layer(images.flatten(1)), targets)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.fixture(autouse=True)
def _no_pytest_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    """LightningCLI warns when ``args`` is given while ``sys.argv`` holds pytest's own arguments."""
    monkeypatch.setattr(sys, "argv", ["train.py"])


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return make_jpegs(tmp_path / "src", 4, size=8)


def _cli(*args: str) -> LightningCLI:
    return LightningCLI(TinyModel, LMDBDataModule, run=False, args=list(args))


def test_print_config_lists_the_datamodule_arguments(tmp_path: Path, source: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        _cli("--print_config", f"--data.train_dir={source}", "--data.backend=raw")
    assert exited.value.code in (0, None)
    data = yaml.safe_load(capsys.readouterr().out)["data"]
    assert data["train_dir"] == str(source) and data["backend"] == "raw"
    assert {"val_dir", "val_fraction", "cache_dir", "storage", "on_error", "on_stale", "batch_size", "num_workers",
            "multiprocessing_context"} <= set(data)
    assert data["val_fraction"] is None and data["storage"] == "auto"


def test_a_yaml_config_instantiates_the_datamodule(tmp_path: Path, source: Path) -> None:
    config = tmp_path / "cfg.yaml"
    data = {"train_dir": str(source), "backend": "raw", "batch_size": 4, "num_workers": 0, "cache_dir": str(tmp_path / "cache"),
            "build_workers": 0, "val_fraction": 0.25, "image_size": 8, "on_error": "skip", "storage": "decoded",
            "multiprocessing_context": "spawn"}
    config.write_text(yaml.safe_dump({"data": data, "trainer": {"accelerator": "cpu", "logger": False}}))
    cli = _cli("--config", str(config))
    dm = cli.datamodule
    assert isinstance(dm, LMDBDataModule)
    assert (dm.backend, dm.batch_size, dm.num_workers, dm.val_fraction) == ("raw", 4, 0, 0.25)
    assert (dm.cache_dir, dm.sources["train"]) == (tmp_path / "cache", source.resolve())
    assert (dm.build_options.on_error, dm.build_options.storage, dm.multiprocessing_context) == ("skip", "decoded", "spawn")
    assert dm.hparams["train_dir"] == str(source) and dm.hparams["backend"] == "raw"
    dm.setup("fit")
    images, _ = next(iter(dm.train_dataloader()))
    assert images.shape == (3, 3, 8, 8)


def test_data_arguments_on_the_command_line(tmp_path: Path, source: Path) -> None:
    cli = _cli(f"--data.train_dir={source}", "--data.cache_dir", str(tmp_path / "cache"), "--data.num_workers=0")
    dm = cli.datamodule
    assert dm.sources["train"] == source.resolve() and dm.backend == "lmdb" and dm.val_fraction == 0.1
    assert dm.num_classes == 2 and dm.classes == ["c0", "c1"]


@pytest.mark.parametrize(
    ("argument", "valid"),
    [
        ("--data.backend=lmbd", ("lmdb", "raw")),
        ("--data.storage=jpg", ("encoded", "decoded")),
        ("--data.on_error=ignore", ("raise", "skip")),
        ("--data.on_stale=never", ("rebuild", "error", "ignore")),
        ("--data.multiprocessing_context=threads", ("fork", "spawn", "forkserver")),
    ],
)
def test_a_bad_choice_is_rejected_at_parse_time(tmp_path: Path, source: Path, capsys: pytest.CaptureFixture[str],
                                                 argument: str, valid: tuple[str, ...]) -> None:
    with pytest.raises(SystemExit) as exited:
        _cli(f"--data.train_dir={source}", "--data.cache_dir", str(tmp_path / "cache"), argument)
    assert exited.value.code not in (0, None)
    captured = capsys.readouterr()
    message = captured.err + captured.out
    name, bad = argument.removeprefix("--").split("=")
    assert name in message and bad in message
    assert all(f"'{value}'" in message for value in valid), message
    assert not (tmp_path / "cache").exists(), "nothing was built"


README = Path(__file__).resolve().parents[1] / "README.md"


def _readme_cli_snippet() -> str:
    """The ``main.py`` of the README's LightningCLI section, as it stands there."""
    section = README.read_text(encoding="utf-8").split("### With LightningCLI", 1)[1]
    snippet = re.search(r"```python\n(.*?)```", section, re.S)
    assert snippet and "# main.py" in snippet.group(1), "the README's LightningCLI section starts with its main.py"
    return snippet.group(1)


def test_the_readme_snippet_fits_a_folder_with_more_classes_than_the_model_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    classes = 3
    assert TinyModel.__init__.__defaults__[0] != classes, "the model's default must not already fit the folder"
    source = make_jpegs(tmp_path / "src", 12, size=8, classes=classes)
    models: list[TinyModel] = []

    class MyModel(TinyModel):
        def __init__(self, num_classes: int = 2, size: int = 8):
            super().__init__(num_classes, size)
            models.append(self)

    monkeypatch.setitem(sys.modules, "my_project", types.SimpleNamespace(MyModel=MyModel))
    monkeypatch.setattr(sys, "argv", [
        "main.py", "fit", f"--data.train_dir={source}", f"--data.cache_dir={tmp_path / 'cache'}", "--data.num_workers=0",
        "--data.batch_size=4", "--data.image_size=8", "--data.build_workers=0",
        "--trainer.max_epochs=1", "--trainer.accelerator=cpu", "--trainer.logger=false", "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false", f"--trainer.default_root_dir={tmp_path}",
    ])
    exec(compile(_readme_cli_snippet(), str(README), "exec"), {})  # runs fit, as `python main.py fit ...` would
    (model,) = models
    assert model.layer.out_features == classes
    assert model.trainer.state.finished and model.trainer.global_step > 0
