"""Store: the on-disk format -- one LMDB file or a sharded folder -- and opening it.

Contract: :mod:`~lightning_lmdb.store.format` owns every key and metadata field a database holds (nothing else
writes a key); :mod:`~lightning_lmdb.store.database` opens any database (a file or a sharded folder) and reads its
metadata; ``envs`` keeps one LMDB environment per process (reopened after a fork); ``shards`` plans and names a
sharded folder's shards; ``fsops`` holds the crash-safe file operations (atomic rename, fsync, free space).
Imports only sources, codec, targets and the options below it; builds and reads sit above.
"""
