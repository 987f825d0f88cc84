"""The PySpark pipeline: a `dledger` data source over node stores or a running group (a table, a
stream, a sink), export, cross-replica verify.

Modules, one job each:

* `arrow_decode` — a store index range → pyarrow RecordBatches (vectorized decoder fast path)
* `datasource`   — the `dledger` Python data source (schema, options, fixed-boundary partitions);
  it dispatches on the options: `path`/`paths` (files, here) or `peers` (the network, below)
* `netclient`    — what the network modes ask of a group: its committed range and raw FETCH answers from any member
* `net_arrow`    — a GET answer → one Arrow batch, checked as arrays
* `net_source`   — the network options, partitions and the batch table of the committed log
* `stream_source`— the stream: offsets are log indexes, admission control, failOnDataLoss
* `sink`         — one entry per row, appended exactly once per micro-batch by the driver
* `session`      — the one SparkSession helper both commands use (master, loopback, shipping)
* `export`       — committed entries → Parquet
* `verify`       — per-node health and range-digest comparison of replicas

Importing this package does not import pyspark; the submodules that need it do.
"""
