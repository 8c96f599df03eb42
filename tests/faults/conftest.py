"""The fault suite: builds killed at exact points, concurrent builders, damaged databases, bad inputs, a full disk.

Its tests import ``imagegen`` (in ``tests/``) and ``faultkit`` (here) as top-level modules, also when
only this folder is collected.
"""

from __future__ import annotations

import sys
from pathlib import Path

for folder in (Path(__file__).parent, Path(__file__).parent.parent):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
