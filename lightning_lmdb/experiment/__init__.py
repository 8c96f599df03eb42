"""The A/B experiment around the library: ``PerfMonitor`` (callbacks), the comparison and its verdict
(report), the demo dataset, the toy and no-op models, the A/B sweeper, and the OmegaConf resolvers for
Hydra configs (``${lmdb_num_classes:${data}}``, :mod:`~lightning_lmdb.experiment.resolvers`), registered
when this package is imported (where OmegaConf is installed); :func:`register_resolvers` does it again.

Needs the ``train`` extra (``pip install -e ".[train]"``: hydra-core, matplotlib, tensorboard,
nvidia-ml-py, pycocotools for the toy detector's mAP); the library itself (``lightning_lmdb``) does not import this package.
"""

from lightning_lmdb.experiment.resolvers import register_resolvers

__all__ = ["register_resolvers"]

try:
    register_resolvers()
except ImportError:  # pragma: no cover - no OmegaConf (Hydra's): no config to resolve, PerfMonitor still works
    pass
