"""Moved to :mod:`lightning_lmdb.experiment.callbacks`; this name keeps old imports working (the same module object)."""

import sys

from lightning_lmdb.experiment import callbacks as _moved

sys.modules[__name__] = _moved
