"""Decode a node's store read-only, one line per entry (safe while the node runs).

Reads DIR/data and DIR/index as they are when dump starts and prints every entry in
[--from, --to] (inclusive, default the whole log, committed or not). Damage is shown, never
fatal: a body whose CRC disagrees prints crc_ok false, a structural problem (gap, index/pos/
size/term mismatch) prints the error.

  text   index term pos size type crc_ok body-preview   (fields that could not be read: -;
         a damaged entry ends with "! <error>")
  jsonl  {"index", "term", "pos", "size", "type", "crc_ok", "error", "body_b64"} per line

Examples:
  dledger dump --store-dir /data/n0 --from 100 --to 120
  dledger dump --store-dir /data/n0 --format jsonl | jq -r .body_b64
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from typing import TextIO

from node.store.decoder import DecodedEntry, StoreDecoder
from node.store.layout import LayoutError
from tools.cli import CliError, log_index, nonneg_int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store-dir", required=True, metavar="DIR", help="the node's store directory (required)")
    parser.add_argument("--from", dest="from_index", type=log_index, metavar="I",
                        help="first index (default: the log's begin)")
    parser.add_argument("--to", dest="to_index", type=log_index, metavar="J",
                        help="last index, inclusive (default: the log's end)")
    parser.add_argument("--format", choices=("text", "jsonl"), default="text",
                        help="output format (default: text)")
    parser.add_argument("--preview", type=nonneg_int, default=40, metavar="N",
                        help="body bytes shown in text format (default: 40)")


def open_reader(store_dir: str) -> StoreDecoder:
    """Open a store for reading, turning 'this is not a store' into a one-line CLI error."""
    try:
        return StoreDecoder(store_dir)
    except (OSError, LayoutError) as e:
        raise CliError(str(e), 2) from None


def _dash(v: object) -> str:
    return "-" if v is None else str(v)


def text_line(e: DecodedEntry, preview: int) -> str:
    crc = "-" if e.crc_ok is None else ("true" if e.crc_ok else "false")
    parts = [str(e.index), _dash(e.term), _dash(e.pos), _dash(e.size), _dash(e.type), crc]
    if e.body is not None:
        shown = repr(e.body[:preview]) + ("..." if len(e.body) > preview else "")
        parts.append(shown)
    if e.error:
        parts.append(f"! {e.error}")
    return " ".join(parts)


def json_line(e: DecodedEntry) -> str:
    return json.dumps({
        "index": e.index, "term": e.term, "pos": e.pos, "size": e.size, "type": e.type,
        "crc_ok": e.crc_ok, "error": e.error,
        "body_b64": None if e.body is None else base64.b64encode(e.body).decode("ascii"),
    }, separators=(",", ":"))


def dump(reader: StoreDecoder, out: TextIO, *, from_index: int | None = None,
         to_index: int | None = None, fmt: str = "text", preview: int = 40) -> int:
    """Write one line per entry to `out`; returns the number of entries written."""
    n = 0
    write = out.write
    for e in reader.iter_entries(from_index, to_index, body=True):
        write((json_line(e) if fmt == "jsonl" else text_line(e, preview)) + "\n")
        n += 1
    return n


def run(args: argparse.Namespace) -> int:
    if args.preview < 0:
        raise CliError("--preview must be >= 0", 2)
    with open_reader(args.store_dir) as reader:
        dump(reader, sys.stdout, from_index=args.from_index, to_index=args.to_index,
             fmt=args.format, preview=args.preview)
    sys.stdout.flush()
    return 0
