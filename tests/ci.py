"""The rule for a test whose prerequisite is missing: skip it with the reason, except on CI, where it fails.

CI (``.ci/run``, with ``CI=true``) provides every prerequisite the tests have (the ``[test]`` extra's packages,
a disk that honours page-cache eviction, FUSE where it can install it): a skip there would hide a test that
never ran, so it is a failure instead.
"""

from __future__ import annotations

import os

import pytest


def on_ci() -> bool:
    """Whether the tests run on CI: ``CI`` set to anything but empty, ``0``, ``false`` or ``no`` (``.ci/run``, GitHub Actions, GitLab)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require(ok: bool, reason: str) -> None:
    """Go on if ``ok``; else skip the calling test with ``reason`` -- or fail it on CI, where the prerequisite is provided.

    Args:
        ok: Whether the prerequisite is there.
        reason: What is missing and how to provide it (the skip's or the failure's message).
    """
    if ok:
        return
    if on_ci():
        pytest.fail(f"CI={os.environ.get('CI')!r}, but a prerequisite is missing (elsewhere this test skips): {reason}", pytrace=False)
    pytest.skip(reason)
