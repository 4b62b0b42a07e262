"""The Spark session of a ``subc`` job: local mode on a laptop, or whatever ``spark-submit`` set up.

Under ``spark-submit`` (the Python driver then runs with ``PYSPARK_GATEWAY_PORT`` set) the master
and resources come from ``spark-submit``; otherwise Spark starts embedded in local mode
(``--master``, default ``local[*]``), with no cluster and no Hadoop install, bound to loopback.  Spark's console
progress bar is on; its log is quiet (warnings and errors only).
"""

from __future__ import annotations

import os
import re
import sys

from ..errors import SubcError

#: Local-mode driver memory (the driver is also the executor in local mode).
LOCAL_DRIVER_MEMORY = "4g"


def under_spark_submit() -> bool:
    """True when this Python process is the driver that ``spark-submit`` started."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def get_session(master: str | None = None, app: str = "subc", conf: dict[str, str] | None = None):
    """A SparkSession (PySpark ``SparkSession``) for ``app``.

    ``master`` defaults to ``local[*]`` outside ``spark-submit``.  Raises :class:`SubcError` when
    PySpark is not installed."""
    try:
        from pyspark.sql import SparkSession
    except ImportError as e:  # pragma: no cover - the spark extra is missing
        raise SubcError("the data pipeline needs PySpark: pip install 'subc[spark]'") from e
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    b = SparkSession.builder.appName(app)
    if not under_spark_submit():
        master = master or "local[*]"
        b = b.master(master).config("spark.driver.memory", LOCAL_DRIVER_MEMORY)
    elif master:
        b = b.master(master)
    if master and master.startswith("local"):
        # embedded Spark talks to itself only: keep the driver (and its web UI) on loopback
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        b = b.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    settings = {
        "spark.ui.showConsoleProgress": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.adaptive.enabled": "true",
    }
    settings.update(conf or {})
    for k, v in settings.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


_SUBC_ERROR = re.compile(r"subc\.errors\.SubcError: (.+)")


def task_error(exc: BaseException) -> SubcError | None:
    """The :class:`SubcError` that a Spark task raised, recovered from Spark's exception text."""
    found = _SUBC_ERROR.findall(str(exc))
    if not found:
        return None
    msg = found[-1].strip()
    return SubcError(msg[len("error: ") :] if msg.startswith("error: ") else msg)
