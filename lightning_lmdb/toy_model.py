"""Moved to :mod:`lightning_lmdb.experiment.toy_model`; this name keeps old imports working (the same module object)."""

import sys

from lightning_lmdb.experiment import toy_model as _moved

sys.modules[__name__] = _moved
