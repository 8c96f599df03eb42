"""The A/B experiment around the library: ``PerfMonitor`` (callbacks), the comparison and its verdict
(report), the demo dataset, the toy and no-op models, the A/B sweeper.

Needs the ``train`` extra (``pip install -e ".[train]"``: hydra-core, matplotlib, tensorboard,
nvidia-ml-py); the library itself (``lightning_lmdb``) does not import this package.
"""
