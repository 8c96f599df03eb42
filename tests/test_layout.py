"""The layout move kept every path working: public names, old module paths, and databases built before it.

Old module paths warn only on their first import in a process, so those checks run in a fresh interpreter.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
from imagegen import make_folder

import lightning_lmdb
from lightning_lmdb._moved import MOVED, STABLE

REPO = Path(lightning_lmdb.__file__).resolve().parent.parent
#: The last commit of the flat layout (every module directly in lightning_lmdb/).
BEFORE_MOVE = "23e2fbd20ad82a505694c57971f0c3e6f428e2d0"

CHECK_PATHS = """
import importlib, json, sys, warnings
warnings.simplefilter("always")
import lightning_lmdb
from lightning_lmdb._moved import MOVED

def moved_warnings(caught):
    return [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning) and "lightning_lmdb" in str(w.message)]

report = {"public": {}, "old": {}}
for name in lightning_lmdb.__all__:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        getattr(lightning_lmdb, name)
    report["public"][name] = moved_warnings(caught)
for old, new in MOVED.items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(f"import {old} as module", sys.argv[1], "exec"), namespace := {})
    module = namespace["module"]
    target = importlib.import_module(new)
    report["old"][old] = {
        "same": module is target and sys.modules[old] is target,
        "spec": module.__spec__.name,
        "warnings": moved_warnings(caught),
        "files": sorted({w.filename for w in caught if "moved to" in str(w.message)}),
    }
print(json.dumps(report))
"""


@pytest.mark.slow
def test_old_paths_are_the_moved_modules_and_warn_naming_the_new_path() -> None:
    done = subprocess.run([sys.executable, "-c", CHECK_PATHS, "importer.py"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["public"] == {name: [] for name in lightning_lmdb.__all__}
    for old, new in MOVED.items():
        seen = report["old"][old]
        assert seen["same"] and seen["spec"] == new, (old, seen)
        if old in STABLE:
            assert seen["warnings"] == [], (old, seen)
        else:
            assert len(seen["warnings"]) == 1 and new in seen["warnings"][0], (old, seen)
            assert seen["files"] == ["importer.py"], (old, seen)  # the warning points at the line that imports


def test_patching_an_old_path_patches_the_running_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "lightning_lmdb.writer", raising=False)  # forget the old path: its first import warns
    with pytest.warns(DeprecationWarning, match=r"lightning_lmdb\.writer moved to lightning_lmdb\.build\.writer"):
        import lightning_lmdb.writer as old
    assert old is sys.modules["lightning_lmdb.build.writer"] is sys.modules["lightning_lmdb.writer"]

    def fake(*args: object, **kwargs: object) -> None:
        raise RuntimeError("patched")

    monkeypatch.setattr("lightning_lmdb.writer.build_lmdb", fake)
    with pytest.raises(RuntimeError, match="patched"):
        lightning_lmdb.build_lmdb("anything", "anywhere.lmdb")


@pytest.mark.slow
def test_a_database_built_before_the_move_opens_up_to_date_and_verifies(tmp_path: Path) -> None:
    archive = subprocess.run(["git", "-C", str(REPO), "archive", BEFORE_MOVE, "lightning_lmdb"], capture_output=True)
    assert archive.returncode == 0, f"this test needs the repository's history (commit {BEFORE_MOVE}): {archive.stderr!r}"
    old_tree = tmp_path / "old"
    tarfile.open(fileobj=io.BytesIO(archive.stdout)).extractall(old_tree, filter="data")
    images = make_folder(tmp_path / "images", per_class=4)
    script = textwrap.dedent("""
        import json, sys
        import lightning_lmdb
        from lightning_lmdb import LMDBDataModule
        dm = LMDBDataModule(train_dir=sys.argv[1], cache_dir=sys.argv[2], val_fraction=0.25, batch_size=4, num_workers=0)
        dm.prepare_data()
        print(json.dumps({"file": lightning_lmdb.__file__, "paths": [str(p) for p in dm.database_paths()]}))
    """)
    cache = tmp_path / "cache"
    env = {**os.environ, "PYTHONPATH": str(old_tree)}
    done = subprocess.run([sys.executable, "-c", script, str(images), str(cache)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    built = json.loads(done.stdout)
    assert built["file"].startswith(str(old_tree))
    before = {path: os.stat(path).st_mtime_ns for path in cache.rglob("*")}

    from lightning_lmdb import LMDBDataModule, verify_lmdb

    dm = LMDBDataModule(train_dir=images, cache_dir=cache, val_fraction=0.25, batch_size=4, num_workers=0)
    assert [str(p) for p in dm.database_paths()] == built["paths"]
    dm.prepare_data()
    assert {path: os.stat(path).st_mtime_ns for path in cache.rglob("*")} == before  # up to date: nothing rebuilt
    for path in built["paths"]:
        assert verify_lmdb(path, source=images).ok
    dm.setup("fit")
    assert len(dm.datasets["train"]) + len(dm.datasets["val"]) == 12
