"""The A/B sweeper of lightning_lmdb's train.py, as a Hydra plugin."""
