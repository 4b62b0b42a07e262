"""The data pipeline (PySpark): ITCH traces and rule sets at scale.

Data flow of ``subc analyze``: trace files -> :mod:`.splits` (BinaryFILE split points, pcap
files) -> :mod:`.messages` (NumPy decoding of every message into columns) -> :mod:`.tables_np`
(the compiled ``entries.json`` tables evaluated on every Add Order) and :mod:`.reference_np`
(the rules evaluated directly, on one representative per class of equivalent messages) ->
:mod:`.analyze` (the Spark job: Parquet, ``summary.json``, plots from :mod:`.plots`).
``subc validate`` is :mod:`.validate`.  The Spark session is made in :mod:`.session`.

Only :mod:`.session`, :mod:`.analyze` and :mod:`.validate` import PySpark; the others are plain
NumPy / PyArrow and run inside Spark's Python workers.
"""
