"""Read: a database (or the raw files) served as a PyTorch ``Dataset``, decoded and transformed.

Contract: :class:`~lightning_lmdb.read.dataset.LMDBImageDataset` and :class:`~lightning_lmdb.read.raw.RawImageDataset`
serve ``(image, target)``; ``views`` are index views (splits, subsets) of one database; ``blockread`` and ``sampler``
read in large sequential blocks and keep a resumable order; ``decoding`` and ``batchdecode`` decode in the workers
or batched on the device; ``transforms`` apply the joint crop / resize / flip to an image and its target;
``loadstats`` counts where the time goes. Reads only through :mod:`lightning_lmdb.store`.
"""
