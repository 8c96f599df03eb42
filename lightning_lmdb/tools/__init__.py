"""Tools: what the ``lightning-lmdb`` command runs, beside the library's core.

``cli`` (the command), ``verify`` (``verify`` and ``info``), ``bench`` (raw vs LMDB, cold and warm cache),
``staging`` (copy a database to node-local disk), ``pagecache`` (evict a file from the page cache for cold runs),
``netfs`` (the latency mount). Built on build, read and store; nothing in the core imports them
(except the DataModule, which stages).
"""
