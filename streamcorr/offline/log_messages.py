"""MCAP files and ROS bags as a :class:`~streamcorr.offline.recording.Recording`: message fields become channels
(see :mod:`streamcorr.offline.logs`). MCAP is read record by record from the start, each record and chunk
bounded before it is read or decompressed; rosbags reads the bags."""

from __future__ import annotations

import io
import json
import math
import os
import struct
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from .recording import ReadLimits, Recording, add_series, need_module, series_of

__all__ = ["MAX_ARRAY", "MAX_DEPTH", "flatten", "read_bag", "read_mcap"]

MAX_ARRAY = 16  # numeric message arrays longer than this (images, scans, covariances) are not channels
MAX_DEPTH = 32  # nesting of a message's fields; deeper messages are skipped (Python's stack is the limit)
_MAX_TOPICS = 65536  # MCAP channels (topics) remembered; messages on more are skipped and counted
MAX_NAME_CHARS = 1024  # longer field names are not channels
INFLATION = 256  # MCAP chunks may decompress to this many times the file's size in all (at least --max-mb)


class _TooDeep(ValueError):
    pass


def flatten(prefix: str, msg: Any, depth: int = 0) -> Iterator[tuple[str, float]]:
    """(channel, value) for each numeric field of a decoded message (dict, ROS message object or sequence).
    Raises OverflowError on an integer beyond float range and ValueError on nesting deeper than MAX_DEPTH."""
    if depth > MAX_DEPTH:
        raise _TooDeep(f"fields nested deeper than {MAX_DEPTH}")
    if isinstance(msg, bool) or msg is None or isinstance(msg, str | bytes):
        return
    if isinstance(msg, int | float | np.integer | np.floating):
        v = float(msg)
        if math.isfinite(v):
            yield prefix, v
        return
    if isinstance(msg, np.ndarray):
        if msg.ndim == 1 and len(msg) <= MAX_ARRAY and msg.dtype.kind in "iuf":
            for k, v in enumerate(msg.tolist()):
                yield from flatten(f"{prefix}.{k}", v, depth + 1)
        return
    if isinstance(msg, list | tuple):
        if len(msg) <= MAX_ARRAY:
            for k, v in enumerate(msg):
                yield from flatten(f"{prefix}.{k}", v, depth + 1)
        return
    items: Iterable[tuple[str, Any]]
    if isinstance(msg, dict):
        items = msg.items()
    elif hasattr(msg, "__dataclass_fields__"):  # rosbags messages
        items = ((k, getattr(msg, k)) for k in msg.__dataclass_fields__)
    elif hasattr(msg, "__slots__"):  # mcap-ros2-support's generated classes
        items = ((k, getattr(msg, k)) for k in msg.__slots__ if not k.startswith("_"))
    else:
        return
    for key, value in items:
        if key == "header" or key == "__msgtype__":  # frame ids and stamps are not signals
            continue
        yield from flatten(f"{prefix}.{key}" if prefix else str(key), value, depth + 1)


def _why_skipped(exc: BaseException) -> str:
    if isinstance(exc, OverflowError):
        return "a number beyond float range"
    if isinstance(exc, _TooDeep | RecursionError):
        return f"fields nested deeper than {MAX_DEPTH}"
    return f"unreadable ({type(exc).__name__})"


class _Collector:
    """Samples per channel from decoded messages, in arrival order (sorted at the end), within the limits:
    16 bytes a sample; fields of channels beyond ``max_channels`` left out and counted."""

    def __init__(self, where: str, kind: str, wanted: set[str] | None, lim: ReadLimits) -> None:
        self.rec = Recording(where, kind, {})
        self.t: dict[str, array[int]] = {}
        self.v: dict[str, array[float]] = {}
        self.counts: dict[str, int] = {}
        self.types: dict[str, str] = {}
        self.wanted = wanted
        self.lim = lim
        self.samples = 0
        self.messages = 0

    def add(self, topic: str, msgtype: str, t_ns: int, msg: Any) -> None:
        if topic not in self.counts and len(self.counts) >= _MAX_TOPICS:
            self.rec.skip(f"messages on topics beyond the first {_MAX_TOPICS:,}")
            return
        self.counts[topic] = self.counts.get(topic, 0) + 1
        self.types[topic] = msgtype
        if not 0 <= t_ns < 2**63:
            self.rec.skip(f"topic {topic}: messages skipped (log time beyond int64 nanoseconds)")
            return
        try:
            fields = list(flatten(topic.lstrip("/"), msg))
        except Exception as exc:  # one message that cannot be read is skipped and counted, never fatal
            self.rec.skip(f"topic {topic}: messages skipped ({_why_skipped(exc)})")
            return
        self.messages += 1
        for name, value in fields:
            if self.wanted is not None and name not in self.wanted:
                continue
            if name not in self.t:
                if len(self.t) >= self.lim.max_channels:
                    self.rec.skip(f"values of channels beyond --max-channels ({self.lim.max_channels:,})")
                    continue
                if len(name) > MAX_NAME_CHARS:  # no live channel takes such a name either
                    self.rec.skip(f"values of fields named longer than {MAX_NAME_CHARS} characters")
                    continue
                self.t[name], self.v[name] = array("q"), array("d")
            self.t[name].append(t_ns)
            self.v[name].append(value)
            self.samples += 1
        if self.samples > self.lim.max_samples:
            raise self.lim.too_many_samples(self.rec.path)

    def skip(self, reason: str) -> None:
        self.rec.skip(reason)

    def done(self) -> Recording:
        self.rec.topics = {k: (self.types[k], self.counts[k]) for k in self.counts}
        for name in list(self.t):
            t, v = self.t.pop(name), self.v.pop(name)
            add_series(self.rec, name, *series_of(np.frombuffer(t, dtype=np.int64), np.frombuffer(v, dtype=np.float64)))
        return self.rec


_MCAP_MAGIC = b"\x89MCAP0\r\n"
_OP_HEADER, _OP_FOOTER, _OP_SCHEMA, _OP_CHANNEL, _OP_MESSAGE, _OP_CHUNK = 0x01, 0x02, 0x03, 0x04, 0x05, 0x06


class _McapLog:
    """An MCAP file read record by record from the start (no index needed, so a file cut short reads up to
    the cut); records and chunks are bounded by ``max_bytes`` before they are read or decompressed."""

    def __init__(self, p: Path, topics: set[str] | None, out: _Collector, lim: ReadLimits) -> None:
        self.records = need_module("mcap.records", "mcap")
        self.stream = need_module("mcap.data_stream", "mcap")
        self.p, self.topics, self.out, self.lim = p, topics, out, lim
        self.schemas: dict[int, Any] = {}
        self.channels: dict[int, Any] = {}
        self.decoders: dict[int, Any] = {}
        self.inflate_budget = 0  # bytes that chunks may still decompress to

    def read(self) -> None:
        p = self.p
        try:
            f = p.open("rb")
        except OSError as exc:
            raise InputError(f"cannot read {p}: {exc.strerror or exc}") from None
        with f:
            size = os.fstat(f.fileno()).st_size
            self.inflate_budget = max(self.lim.max_bytes, INFLATION * size)
            if f.read(8) != _MCAP_MAGIC:
                raise InputError(f"{p} is not a readable MCAP file: it does not start with the MCAP magic bytes")
            pos, first = 8, True
            while True:
                head = f.read(9)
                if len(head) < 9:
                    self._cut(pos, "the file ends without a footer" if not head else "the file ends inside a record")
                    return
                opcode, length = struct.unpack("<BQ", head)
                if first and opcode != _OP_HEADER:
                    raise InputError(f"{p} is not a readable MCAP file: its first record is not a header")
                first = False
                if opcode == 0 or length > size - pos - 9:
                    self._cut(pos, "a record runs past the end of the file" if opcode else "a damaged record")
                    return
                if length > self.lim.max_bytes:
                    raise InputError(f"{p}: a record of {length >> 20:,} MiB at byte {pos:,}, more than --max-mb "
                                     f"({self.lim.max_mb}) allows: raise --max-mb")  # fmt: skip
                body = f.read(length)
                pos += 9 + length
                if opcode == _OP_FOOTER:
                    return
                if opcode == _OP_CHUNK:
                    self._chunk(body, pos)
                else:
                    self._record(opcode, body)

    def _cut(self, pos: int, why: str) -> None:
        if self.out.messages == 0 and not self.out.rec.skipped:
            raise InputError(f"{self.p} is not a readable MCAP file: {why} at byte {pos:,}, before any message")
        self.out.rec.notes.append(f"{why} at byte {pos:,} (a recording cut short?): read the "
                                  f"{sum(self.out.counts.values()):,} messages before it")  # fmt: skip

    def _parse(self, cls: Any, body: bytes) -> Any:
        return cls.read(self.stream.ReadDataStream(io.BytesIO(body)))

    def _record(self, opcode: int, body: bytes) -> None:
        try:
            if opcode == _OP_MESSAGE:
                channel_id, _seq, log_time, _pub = struct.unpack_from("<HIQQ", body)
                self._message(channel_id, log_time, body[22:])
            elif opcode == _OP_SCHEMA:
                schema = self._parse(self.records.Schema, body)
                self.schemas[schema.id] = schema
            elif opcode == _OP_CHANNEL and len(self.channels) < _MAX_TOPICS:
                channel = self._parse(self.records.Channel, body)
                self.channels[channel.id] = channel
        except InputError:
            raise
        except Exception:  # struct.error, EndOfFile, UnicodeDecodeError: a damaged record
            self.out.skip("damaged records skipped")

    def _chunk(self, body: bytes, pos: int) -> None:
        # start, end, uncompressed size, crc, compression, records: parsed in place (the records not copied)
        try:
            (size,) = struct.unpack_from("<Q", body, 16)
            (n,) = struct.unpack_from("<I", body, 28)
            compression = body[32 : 32 + n].decode()
            (length,) = struct.unpack_from("<Q", body, 32 + n)
            if 40 + n + length > len(body):
                raise ValueError("records past the chunk")
        except (struct.error, UnicodeDecodeError, ValueError):
            self.out.skip("damaged chunks skipped")
            return
        if size > self.lim.max_bytes:
            raise InputError(f"{self.p}: a chunk at byte {pos:,} decompresses to {size >> 20:,} MiB, more than "
                             f"--max-mb ({self.lim.max_mb}) allows: raise --max-mb")  # fmt: skip
        self.inflate_budget -= size
        if self.inflate_budget < 0:  # small chunks that each expand within bounds, by the thousand
            raise InputError(f"{self.p}: its chunks decompress to more than {INFLATION} times the file's size (or "
                             f"--max-mb, if more): not a recording? raise --max-mb")  # fmt: skip
        data = self._inflate(compression, memoryview(body)[40 + n : 40 + n + length], size)
        if data is None:
            self.out.skip("damaged chunks skipped")
            return
        at = 0
        while at + 9 <= len(data):
            opcode, length = struct.unpack_from("<BQ", data, at)
            if at + 9 + length > len(data):
                self.out.skip("damaged records skipped")
                return
            self._record(opcode, bytes(data[at + 9 : at + 9 + length]))
            at += 9 + length

    def _inflate(self, compression: str, packed: memoryview, size: int) -> memoryview | bytes | None:
        """The chunk's records, at most their declared size (None: damaged, or another size than declared)."""
        try:
            if compression == "":
                data: memoryview | bytes = packed
            elif compression == "zstd":
                zstd = need_module("zstandard", "zstandard")
                reader = zstd.ZstdDecompressor().stream_reader(packed)
                out = bytearray()
                while len(out) <= size and (part := reader.read(min(1 << 20, size + 1 - len(out)))):
                    out += part
                data = memoryview(out)
            elif compression == "lz4":
                lz4 = need_module("lz4.frame", "lz4")
                data = lz4.LZ4FrameDecompressor().decompress(packed, max_length=size + 1)
            else:
                self.out.skip(f"chunks with unknown compression {compression[:40]!r} skipped")
                return None
        except InputError:
            raise
        except Exception:
            return None
        return data if len(data) == size else None

    def _message(self, channel_id: int, log_time: int, data: bytes) -> None:
        channel = self.channels.get(channel_id)
        if channel is None:
            self.out.skip("messages on a channel not declared before them, skipped")
            return
        if self.topics is not None and channel.topic not in self.topics:
            return
        if channel_id not in self.decoders:
            self.decoders[channel_id] = self._decoder(channel)
        decode = self.decoders[channel_id]
        schema = self.schemas.get(channel.schema_id)
        msgtype = schema.name if schema is not None else channel.message_encoding
        if decode is None:
            self.out.counts[channel.topic] = self.out.counts.get(channel.topic, 0) + 1
            self.out.types[channel.topic] = msgtype
            return
        try:
            msg = decode(data)
        except Exception as exc:  # one undecodable message is skipped and counted, not fatal
            self.out.skip(f"topic {channel.topic}: messages skipped (undecodable: {type(exc).__name__})")
            return
        self.out.add(channel.topic, msgtype, log_time, msg)

    def _decoder(self, channel: Any) -> Any:
        enc = channel.message_encoding
        schema = self.schemas.get(channel.schema_id)
        if enc == "json":
            return lambda data: json.loads(data)
        if enc == "cdr" and schema is not None and schema.encoding in ("ros2msg", "ros2idl"):
            ros2 = need_module("mcap_ros2.decoder", "mcap-ros2-support")
            try:
                return ros2.DecoderFactory().decoder_for(enc, schema)
            except Exception as exc:
                self.out.rec.notes.append(f"topic {channel.topic}: schema not readable ({type(exc).__name__})")
                return None
        self.out.rec.notes.append(f"topic {channel.topic}: message encoding {enc[:40]!r} is not read (JSON and ROS 2 "
                                  "CDR are)")  # fmt: skip
        return None


def read_mcap(p: Path, topics: set[str] | None, wanted: set[str] | None, lim: ReadLimits) -> Recording:
    out = _Collector(str(p), "MCAP", wanted, lim)
    _McapLog(p, topics, out, lim).read()
    return out.done()


def read_bag(p: Path, topics: set[str] | None, wanted: set[str] | None, lim: ReadLimits) -> Recording:
    highlevel = need_module("rosbags.highlevel", "rosbags")
    typesys = need_module("rosbags.typesys", "rosbags")
    kind = "ROS 1 bag" if p.suffix.lower() == ".bag" else "ROS 2 bag"
    out = _Collector(str(p), kind, wanted, lim)
    try:  # ROS 2 bags before Iron carry no message definitions: the Humble types are the default
        store = typesys.get_typestore(typesys.Stores.ROS2_HUMBLE)
        with highlevel.AnyReader([p], default_typestore=store) as reader:
            conns = [c for c in reader.connections if topics is None or c.topic in topics]
            try:
                for conn, t_ns, raw in reader.messages(connections=conns):
                    try:
                        msg = reader.deserialize(raw, conn.msgtype)
                    except Exception as exc:  # an unknown type or a damaged message: skipped and counted
                        out.skip(f"topic {conn.topic}: messages skipped (cannot decode {conn.msgtype}: "
                                 f"{type(exc).__name__})")  # fmt: skip
                        continue
                    out.add(conn.topic, conn.msgtype, t_ns, msg)
            except InputError:
                raise
            except Exception as exc:  # damage part way: what came before it is kept
                if out.messages == 0:
                    raise
                out.rec.notes.append(f"the bag is damaged part way ({type(exc).__name__}): read the "
                                     f"{sum(out.counts.values()):,} messages before it")  # fmt: skip
    except InputError:
        raise
    except Exception as exc:  # rosbags' AnyReaderError, ReaderError, ...
        raise InputError(f"{p} is not a readable ROS bag: {type(exc).__name__}: {str(exc)[:300]}") from None
    return out.done()
