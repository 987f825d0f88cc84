"""The one SparkSession helper `export`, `verify`, the bench and the tests share.

Everything here exists because a default session goes wrong on this kind of machine:

* Executors start `python3` from PATH unless PYSPARK_PYTHON is in the environment *before*
  the JVM starts, and that interpreter has neither our venv's pyarrow nor our code. So both
  PYSPARK_PYTHON and PYSPARK_DRIVER_PYTHON are set to `sys.executable` first.
* A local session binds to the machine's public address and opens a web UI; ours binds to
  127.0.0.1 (SPARK_LOCAL_IP, spark.driver.host/bindAddress) with the UI and console progress
  bar off, and logs only errors: the commands' output is the product.
* Executors on other machines (or a standalone worker) cannot import `node`/`tools` unless the
  code travels with the job: for a non-local master the packages are zipped and added with
  `addPyFile`, unless `ship=False` (the code is installed on the workers already).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

from pyspark.sql import SparkSession

log = logging.getLogger("dledger.pipeline")

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_PACKAGES = ("node", "ipc", "tools")
_LOOPBACK = "127.0.0.1"

# Errors only, on stderr: replaces Spark's default profile, whose INFO/WARN chatter (and the
# "Using Spark's default log4j profile" banner) would drown the commands' own output. The root
# stays at WARN (the level Spark assumes for a shell, so it prints no "Setting default log
# level" notice) and the appender's filter drops everything below ERROR.
_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = stderr
appender.console.type = Console
appender.console.name = stderr
appender.console.target = SYSTEM_ERR
appender.console.filter.threshold.type = ThresholdFilter
appender.console.filter.threshold.level = error
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
"""


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[") or master.startswith("local-cluster")


def _loopback_master(master: str) -> bool:
    """A standalone master on this machine's loopback: the driver must be reachable there too."""
    if not master.startswith("spark://"):
        return False
    hosts = [urlparse("spark://" + h).hostname for h in master[len("spark://"):].split(",")]
    return all(h in ("127.0.0.1", "localhost") for h in hosts)


def package_zip(root: Path = REPO_ROOT) -> Path:
    """Zip our packages (sources only) into a temp file removed at exit; returns its path."""
    name = _temp_file("dledger-pkg-", ".zip")
    with zipfile.ZipFile(name, "w", zipfile.ZIP_DEFLATED) as zf:
        for pkg in SHIPPED_PACKAGES:
            for path in sorted((root / pkg).rglob("*.py")):
                zf.write(path, path.relative_to(root).as_posix())
    return name


def _temp_file(prefix: str, suffix: str) -> Path:
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix)
    os.close(fd)
    atexit.register(lambda: Path(name).unlink(missing_ok=True))
    return Path(name)


def quiet_log_config() -> Path:
    """A log4j2 file that keeps the driver JVM at ERROR from its first line."""
    path = _temp_file("dledger-log4j2-", ".properties")
    path.write_text(_LOG4J2, encoding="utf-8")
    return path


def build_session(master: str = "local[*]", *, app_name: str = "dledger", ship: bool = True,
                  shuffle_partitions: int = 8, conf: dict[str, str] | None = None,
                  java_options: str = "") -> SparkSession:
    """Start (or return the already running) session with our data source registered.

    `java_options` are appended to the driver JVM's options (the tests use a C1-only JIT,
    which starts faster); `conf` entries are set last and win.
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    local = is_local(master)
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
               .config("spark.sql.adaptive.enabled", "true")
               .config("spark.python.worker.reuse", "true")
               .config("spark.driver.extraJavaOptions",
                       f"-Dlog4j2.configurationFile=file:{quiet_log_config()} {java_options}".strip()))
    if local or _loopback_master(master):
        os.environ["SPARK_LOCAL_IP"] = _LOOPBACK
        builder = (builder.config("spark.driver.host", _LOOPBACK)
                   .config("spark.driver.bindAddress", _LOOPBACK))
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    logging.getLogger("py4j").setLevel(logging.WARNING)  # its INFO lines are not ours to show
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if ship and not local:
        spark.sparkContext.addPyFile(str(package_zip()))
    from tools.pipeline import write_mode
    from tools.pipeline.datasource import DLedgerDataSource

    spark.dataSource.register(DLedgerDataSource)
    write_mode.install()  # `df.write.format("dledger").save()` appends (write_mode.py)
    return spark


@contextlib.contextmanager
def spark_session(master: str = "local[*]", *, ship: bool = True,
                  app_name: str = "dledger") -> Iterator[SparkSession]:
    """A session for one command: reuses an active one (the test suite's) and leaves it
    running; otherwise starts one and stops it on the way out."""
    active = SparkSession.getActiveSession()
    if active is not None:
        from tools.pipeline import write_mode
        from tools.pipeline.datasource import DLedgerDataSource

        active.dataSource.register(DLedgerDataSource)
        write_mode.install()
        yield active
        return
    spark = build_session(master, ship=ship, app_name=app_name)
    try:
        yield spark
    finally:
        spark.stop()
