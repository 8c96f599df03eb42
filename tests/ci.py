"""The rule for a test whose prerequisite is missing: skip it with the reason, except on CI, where it fails.

CI (``.ci/run``, with ``CI=true``) provides every prerequisite the tests have (the ``[test]`` extra's packages,
a disk that honours page-cache eviction, FUSE where it can install it): a skip there would hide a test that
never ran, so it is a failure instead.
"""

from __future__ import annotations

import os

import pytest

#: Whether the tests run on CI (``CI=true``, as GitHub Actions, GitLab and ``.ci/run`` set it).
ON_CI = os.environ.get("CI", "").lower() == "true"


def require(ok: bool, reason: str) -> None:
    """Go on if ``ok``; else skip the calling test with ``reason`` -- or fail it on CI, where the prerequisite is provided.

    Args:
        ok: Whether the prerequisite is there.
        reason: What is missing and how to provide it (the skip's or the failure's message).
    """
    if ok:
        return
    if ON_CI:
        pytest.fail(f"CI=true, but a prerequisite is missing (this test would be skipped elsewhere): {reason}")
    pytest.skip(reason)
