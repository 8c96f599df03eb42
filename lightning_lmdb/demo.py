"""Moved to :mod:`lightning_lmdb.experiment.demo`; this name keeps old imports working (the same module object)."""

import sys

from lightning_lmdb.experiment import demo as _moved

sys.modules[__name__] = _moved
