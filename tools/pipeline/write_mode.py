"""`df.write.format("dledger")...save()` appends, as the documented one-liner promises.

Spark refuses its default save mode, ErrorIfExists, for every Python data source ("cannot be
written with ErrorIfExists mode, please use Append or Overwrite modes instead"): a data source
written in Python cannot say whether its "table" exists. A log has one meaningful batch write
mode anyway — append (the sink refuses overwrite) — so for our format, and only when the caller
chose no mode, `save` uses append. Any mode the caller sets is passed through untouched, and
every other format is left alone. `build_session` installs this once, where it registers the
data source.
"""

from __future__ import annotations

from typing import Any

FORMAT = "dledger"
_installed = False


def install() -> None:
    """Wrap `DataFrameWriter.format`, `.mode` and `.save` (idempotent)."""
    global _installed
    if _installed:
        return
    from pyspark.sql.readwriter import DataFrameWriter

    original_format, original_mode, original_save = DataFrameWriter.format, DataFrameWriter.mode, DataFrameWriter.save

    def format(self: DataFrameWriter, source: str) -> DataFrameWriter:  # noqa: A001 - Spark's name
        self._dledger_format = isinstance(source, str) and source.lower() == FORMAT
        return original_format(self, source)

    def mode(self: DataFrameWriter, saveMode: str | None) -> DataFrameWriter:  # noqa: N803 - Spark's name
        self._dledger_mode_chosen = saveMode is not None
        return original_mode(self, saveMode)

    def save(self: DataFrameWriter, path: str | None = None, format: str | None = None,  # noqa: A002
             mode: str | None = None, partitionBy: Any = None, **options: Any) -> None:  # noqa: N803
        ours = (format.lower() == FORMAT) if isinstance(format, str) else getattr(self, "_dledger_format", False)
        if ours and mode is None and not getattr(self, "_dledger_mode_chosen", False):
            mode = "append"
        return original_save(self, path, format, mode, partitionBy, **options)

    for f, orig in ((format, original_format), (mode, original_mode), (save, original_save)):
        f.__doc__, f.__name__, f.__qualname__ = orig.__doc__, orig.__name__, orig.__qualname__
    DataFrameWriter.format, DataFrameWriter.mode, DataFrameWriter.save = format, mode, save
    _installed = True
