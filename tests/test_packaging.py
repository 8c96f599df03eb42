"""The library stands without the experiment's dependencies, and exports its public names lazily."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

EXTRA_ONLY = {"hydra", "omegaconf", "matplotlib", "pynvml", "tensorboard"}
PACKAGE = Path(__file__).resolve().parents[1] / "lightning_lmdb"


def _top_level_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_the_library_does_not_import_the_train_extra() -> None:
    library = [p for p in PACKAGE.rglob("*.py") if "experiment" not in p.relative_to(PACKAGE).parts]
    assert len(library) > 10
    offenders = {str(p.relative_to(PACKAGE)): _top_level_imports(p) & EXTRA_ONLY for p in library}
    assert not {k: v for k, v in offenders.items() if v}, "the library must import without the train extra"
    assert _top_level_imports(PACKAGE / "experiment" / "report.py") & EXTRA_ONLY, "the check sees such imports"


@pytest.mark.slow
def test_importing_the_library_loads_no_hydra() -> None:
    code = ("import sys, lightning_lmdb.datamodule.module, lightning_lmdb.tools.cli, lightning_lmdb.tools.verify, "
            "lightning_lmdb.tools.bench; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'hydra', 'omegaconf'}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


@pytest.mark.slow
def test_the_package_exports_lazily() -> None:
    code = ("import sys, lightning_lmdb; "
            "print(sorted({m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision')} "
            "| {m for m in set(lightning_lmdb._EXPORTS.values()) if m in sys.modules}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]", "import lightning_lmdb must import none of its modules, nor torch"


def test_every_public_name_resolves_to_its_module() -> None:
    import lightning_lmdb

    for name, module in lightning_lmdb._EXPORTS.items():
        assert name in lightning_lmdb.__all__
        assert getattr(lightning_lmdb, name) is getattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        lightning_lmdb.nope  # noqa: B018


def test_stage_is_importable_from_the_package() -> None:
    import lightning_lmdb
    from lightning_lmdb import stage
    from lightning_lmdb.tools.staging import stage as documented

    assert stage is documented and "stage" in lightning_lmdb.__all__


def test_ci_runs_the_readmes_test_command_and_the_quick_start_has_two_commands() -> None:
    root = Path(__file__).resolve().parents[1]
    command = (root / ".ci" / "run").read_text().strip().splitlines()[-1]
    readme = (root / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = [block.split("```", 1)[0].strip() for block in quick_start.split("```bash\n")[1:]]
    assert blocks == [blocks[0], command] and blocks[0].endswith("python train.py data=lmdb"), blocks
