"""Reads an offline W&B run's ``run-<id>.wandb`` file back into history rows and config.

wandb 0.31 ships no Python reader for its run log any more (the old ``wandb.sdk.internal.datastore``
is gone), so the tests read it themselves. The file is LevelDB's log format, as wandb writes it:

- a 7-byte file header: ``b":W&B"``, magic ``0xBEE1`` (uint16 LE), version 0 (uint8);
- 32 KiB blocks of chunks, each ``crc32 (uint32 LE) | length (uint16 LE) | type (uint8) | data``,
  type 1 FULL, 2 FIRST, 3 MIDDLE, 4 LAST; a block tail shorter than a chunk header is zero padding;
- the checksum is zlib's CRC-32 of the data, seeded with the CRC-32 of the type byte;
- each reassembled record is a ``wandb.proto.wandb_internal_pb2.Record`` protobuf.

Every checksum is verified, so a reader that drifted from the format fails loudly, not quietly.
"""

from __future__ import annotations

import json
import struct
import time
import zlib
from pathlib import Path
from typing import Any

_HEADER = struct.Struct("<4sHB")
_CHUNK = struct.Struct("<IHB")
_BLOCK = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def read_records(path: str | Path, timeout: float = 30.0) -> list[Any]:
    """Every record of a finished run's log.

    ``run.finish()`` can return before wandb-core has written the log out (seen with wandb 0.31
    under load), so this waits, up to ``timeout`` seconds, for the log's last record: ``exit``, or
    ``footer`` after it in older wandb.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            records = _parse(Path(path))
        except (ValueError, struct.error):  # a chunk still being written
            records = []
        kinds = [r.WhichOneof("record_type") for r in records]
        # wandb 0.31 ends the log with the exit record; older wandb (0.17, the declared floor) writes history,
        # summary, final and footer records after it.
        if kinds and (kinds[-1] == "exit" or ("exit" in kinds and kinds[-1] == "footer")):
            return records
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} has no exit record after {timeout}s (records: {kinds}).")
        time.sleep(0.1)


def _parse(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    if len(data) < _HEADER.size:
        return []
    ident, magic, version = _HEADER.unpack_from(data, 0)
    if (ident, magic, version) != (b":W&B", 0xBEE1, 0):
        raise ValueError(f"{path} is not a W&B run log (header {ident!r} {magic:#x} v{version}).")
    records, pending, pos = [], b"", _HEADER.size
    while pos + _CHUNK.size <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _CHUNK.size:
            pos += left
            continue
        crc, length, kind = _CHUNK.unpack_from(data, pos)
        if (crc, length, kind) == (0, 0, 0):  # zero fill to the end of the block
            pos += left
            continue
        chunk = data[pos + _CHUNK.size : pos + _CHUNK.size + length]
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != crc:
            raise ValueError(f"{path}: bad checksum at byte {pos}.")
        pos += _CHUNK.size + length
        if kind == _FULL:
            records.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            records.append(pending + chunk)
            pending = b""
        else:
            raise ValueError(f"{path}: unknown chunk type {kind} at byte {pos}.")
    parsed = []
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        parsed.append(record)
    return parsed


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def _items_to_dict(items: Any) -> dict[str, Any]:
    # Media and tables arrive as one item per field with a nested key (["preds", "nrows"]).
    row: dict[str, Any] = {}
    for item in items:
        path = [item.key] if item.key else list(item.nested_key)
        target = row
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = json.loads(item.value_json)
    return row


def history(path: str | Path) -> list[dict[str, Any]]:
    """The rows ``run.log`` wrote, in order, with wandb's ``_step`` / ``_runtime`` / ``_timestamp``."""
    return [
        _items_to_dict(record.history.item)
        for record in read_records(path)
        if record.WhichOneof("record_type") == "history"
    ]


def config(path: str | Path) -> dict[str, Any]:
    """The run's config as last updated (``run`` record's config, then ``config`` records)."""
    result: dict[str, Any] = {}
    for record in read_records(path):
        kind = record.WhichOneof("record_type")
        updates = record.run.config.update if kind == "run" else record.config.update if kind == "config" else []
        for item in updates:
            result[_key(item)] = json.loads(item.value_json)
    return result


def run_info(path: str | Path) -> dict[str, str]:
    for record in read_records(path):
        if record.WhichOneof("record_type") == "run":
            return {"project": record.run.project, "display_name": record.run.display_name, "run_id": record.run.run_id}
    raise ValueError(f"{path} has no run record.")
