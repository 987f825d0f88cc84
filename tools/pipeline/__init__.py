"""The PySpark pipeline over node stores: a `dledger` data source, export, cross-replica verify.

Modules, one job each:

* `arrow_decode` — a store index range → pyarrow RecordBatches (vectorized decoder fast path)
* `datasource`   — the `dledger` Python data source (schema, options, fixed-boundary partitions)
* `session`      — the one SparkSession helper both commands use (master, loopback, shipping)
* `export`       — committed entries → Parquet
* `verify`       — per-node health and range-digest comparison of replicas

Importing this package does not import pyspark; the submodules that need it do.
"""
