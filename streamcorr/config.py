"""The daemon's YAML configuration: one file, validated with pydantic v2 (unknown keys are errors).

Errors name the key path and the fix, e.g.
``sources.0.port: Input should be less than or equal to 65535 (got 70000)``.
See examples/*.yaml for one complete file per transport and docs/configuration.md (generated from this
schema, with the comment beside each key) for every key.

>>> cfg = parse_config({"version": 1, "sources": [{"type": "zmq", "endpoint": "tcp://127.0.0.1:5555"}]})
>>> cfg.window.samples, cfg.outputs.zmq is None
(1024, True)
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .config_errors import describe, echo
from .errors import ConfigError
from .names import name_problem

__all__ = ["Config", "load_config", "parse_config"]

# defaults the parts share, each defined here once; infonet-v2 is at or above v1 (models/README.md)
SHIPPED_WEIGHTS, DEFAULT_WEIGHTS_NAME = ("infonet-v1", "infonet-v2"), "infonet-v2"
MQTT_RECEIVE_BUFFER = 4 << 20  # bytes: a fraction of a second of a fast burst of small messages
MIN_RECEIVE_BUFFER = 64 << 10  # bytes: a smaller fixed buffer starves the reader
SCREENING: Literal["auto", "on", "off"] = "auto"  # auto: screen when the pairs exceed the network's hop budget
MAX_AGE_S = 120.0  # a backstop network estimate per pair (engine/scheduler.py says why 120 s)
HOP_S = 1.0  # seconds between evaluations when neither window.hop_samples nor window.hop_s is given
HOP_BUDGET = 0.8  # share of each hop the network may use, at the measured pairs/s
MAX_FALSE_ALARM_RATE = 0.1  # false_alarm_rate lies in (0, this): above it the quantile is no longer a tail
SCHEMA_VERSION = 1
MAX_CONFIG_BYTES = 1 << 20  # a configuration is a few KiB; more is a mistake (or /dev/zero)
MAX_CONFIG_VALUES = 100_000  # values after YAML aliases are expanded: a "billion laughs" file stops here


def _count_values(data: Any, limit: int) -> int:
    """Values in ``data`` as if every YAML alias were copied out; stops counting past ``limit``."""
    seen, stack = 0, [data]
    while stack and seen <= limit:
        item = stack.pop()
        seen += 1
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return seen


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Tls(_Strict):
    """TLS to an MQTT broker (streamcorr.transport.mqtt builds the SSL context from it)."""

    ca_file: str | None = None  # the CA that signed the broker's certificate; None: the system's trust store
    cert_file: str | None = None  # with key_file: a client certificate, for brokers that ask for one
    key_file: str | None = None  # the client certificate's private key
    insecure: bool = False  # skip host-name verification (test brokers only)


class Payload(_Strict):
    """How a source decodes payloads (streamcorr.ingest.payload.PayloadDecoder takes its settings from here)."""

    # auto: JSON, msgpack or a bare number, told apart by the first byte
    format: Literal["auto", "json", "msgpack", "number"] = "auto"
    channel_template: str = "{topic}/{key}"  # topic levels {topic[0]}.., payload field {key}
    time_field: str = "t"  # the payload field holding the time; without it, the arrival time
    time_unit: Literal["s", "ms", "us", "ns"] = "s"  # unit of every time in a payload (t, t0, dt)
    max_payload_bytes: int = Field(1 << 20, ge=16, le=64 << 20)  # larger messages are dropped whole ("oversize")
    # a message with more is dropped ("too_many_samples")
    max_samples_per_message: int = Field(100_000, ge=1, le=10_000_000)
    max_topic_bytes: int = Field(1024, ge=1, le=65535)  # longer topics are dropped whole ("topic")


class MqttConnection(_Strict):
    """One MQTT broker connection: the settings of streamcorr.transport.mqtt, for sources, outputs and clients."""

    host: str = "127.0.0.1"  # the broker
    port: int = Field(1883, ge=1, le=65535)  # the broker's port
    client_id: str | None = None  # None: the broker assigns one
    username: str | None = None  # with password: the broker's login (use TLS beyond loopback)
    password: str | None = None  # see username
    tls: Tls | None = None
    qos: Literal[0, 1, 2] = 0  # MQTT quality of service for subscriptions and publishing
    keepalive_s: int = Field(30, ge=5, le=3600)  # MQTT keep-alive: a silent broker is taken for gone after 1.5x this
    timeout_s: float = Field(10.0, gt=0, le=3600)  # connect, subscribe and publish acknowledgements
    reconnect_min_s: float = Field(0.5, gt=0)  # jittered backoff between reconnects: from this ...
    reconnect_max_s: float = Field(30.0, gt=0)  # ... doubling up to this

    @model_validator(mode="after")
    def _backoff_order(self) -> MqttConnection:
        if self.reconnect_min_s > self.reconnect_max_s:
            raise ValueError(f"reconnect_min_s ({self.reconnect_min_s}) must not exceed reconnect_max_s")
        return self


class MqttSourceConfig(MqttConnection, Payload):
    type: Literal["mqtt"]  # this table's keys apply with type: mqtt
    topics: list[str] = Field(min_length=1)  # subscriptions, MQTT wildcards allowed (sensors/#)
    # messages waiting to be decoded, at most: a batch is decoded once it holds this many (at most 1,000)
    queue_size: int = Field(10_000, ge=1, le=1_000_000)
    queue_bytes: int = Field(64 << 20, ge=1 << 16, le=4 << 30)  # ... or this many bytes of topics and payloads
    # the socket's receive buffer, fixed: holds a burst while decoding catches up. Above net.core.rmem_max (a
    # stock kernel's is 208 KiB) it is not set, and the kernel's own auto-tuned buffer serves, as with 0
    receive_buffer_bytes: int = Field(MQTT_RECEIVE_BUFFER, ge=0, le=1 << 30, strict=True)

    @field_validator("receive_buffer_bytes")
    @classmethod
    def _receive_buffer_floor(cls, v: int) -> int:
        if 0 < v < MIN_RECEIVE_BUFFER:
            raise ValueError(f"must be 0 (the kernel's own buffer) or at least {MIN_RECEIVE_BUFFER} bytes; got {v}")
        return v


class ZmqSourceConfig(Payload):
    type: Literal["zmq"]  # this table's keys apply with type: zmq
    endpoint: str = Field(pattern=r"^(tcp|ipc|inproc)://")  # where to connect (or bind, with bind: true)
    # sub: a SUB socket (a PUB sender drops when it is full); pull: a PULL socket (the sender blocks)
    mode: Literal["sub", "pull"] = "sub"
    bind: bool = False  # bind the endpoint and let senders connect, instead of connecting to a sender
    topics: list[str] = Field(default_factory=lambda: [""])  # sub: topic prefixes subscribed ("": all)
    # messages libzmq queues for this socket; beyond, SUB drops (seen as seq_gaps) and PULL blocks
    rcvhwm: int = Field(10_000, ge=1, le=1_000_000)


Source = Annotated[MqttSourceConfig | ZmqSourceConfig, Field(discriminator="type")]


class Channels(_Strict):
    names: list[str] = Field(default_factory=list)  # known up front, in matrix order
    auto_add: bool = True  # channels first seen at run time join the matrix
    rate_hz: float = Field(100.0, gt=0, le=100_000)  # the common clock
    max_staleness_s: float = Field(0.05, ge=0)  # sample-and-hold limit
    # in all, names first; samples for further new names dropped. At most 2,048: 12 N^2 bytes of matrices plus
    # N names must fit one envelope (64 MiB)
    max_channels: int = Field(256, ge=1, le=2048)
    auto_pairs_per_hop: int = Field(1024, ge=1)  # pairs with an auto-added channel evaluated per hop, at most
    max_future_s: float | None = Field(5.0, ge=0)  # samples stamped further ahead of the receive clock dropped
    max_name_bytes: int = Field(256, ge=1, le=4096)  # channel names: UTF-8, printable, at most this long
    # an auto-added channel with no sample for this long (stream time, and at least one window: until then it can
    # still hold values) leaves the matrix and returns as a new channel when it speaks again; None: never. 60 s is
    # about six windows at the defaults: a device that reconnects within a minute keeps its place and its pairs'
    # history, while churn of one new name a second holds about 60 silent channels (1,800 pairs), not all of them
    retire_after_s: float | None = Field(60.0, gt=0)
    # a channel whose samples all stay more than a window behind its newest (or beyond max_future_s) for this long
    # in their own stamps had its clock stepped: it is re-anchored (later stamps shifted onto the stream clock).
    # Below /healthz's default 10 s staleness bound, so a step does not make the daemon look stuck; None: never
    reanchor_after_s: float | None = Field(5.0, gt=0)

    @model_validator(mode="after")
    def _names_fit(self) -> Channels:
        if len(self.names) > self.max_channels:
            raise ValueError(f"{len(self.names)} names but max_channels is {self.max_channels}: raise max_channels")
        for name in self.names:
            if (why := name_problem(name, self.max_name_bytes)) is not None:
                raise ValueError(f"channel name {name!r:.60} is not usable ({why}): UTF-8, printable, max_name_bytes")
        return self


class Window(_Strict):
    samples: int = Field(1024, ge=32, le=1 << 20)  # window length, samples of the common clock
    # samples between evaluations (give this or hop_s; neither: one hop per HOP_S, a second)
    hop_samples: int | None = Field(None, ge=1)
    hop_s: float | None = Field(None, gt=0)  # seconds between evaluations
    # share of the window where both channels must have data for a pair to be evaluated
    min_coverage: float = Field(0.9, gt=0, le=1)
    skip_stale_hops: bool = True  # live: when compute falls behind, jump to the newest window; replay: false
    # drop: a pair's window holds the ticks where its slower channel has a new sample (a held value beside new
    # ones makes near-copies of earlier rows, which look like dependence); keep: every tick counts
    repeated_rows: Literal["drop", "keep"] = "drop"

    @model_validator(mode="after")
    def _one_hop(self) -> Window:
        if self.hop_samples is not None and self.hop_s is not None:
            raise ValueError("give hop_samples or hop_s, not both")
        return self


class Pairs(_Strict):
    # all: every pair; list: the pairs given; groups: each of groups with each of groups_with
    mode: Literal["all", "list", "groups"] = "all"
    pairs: list[tuple[str, str]] = Field(default_factory=list)  # mode: list
    groups: list[str] = Field(default_factory=list)  # mode: groups (groups x groups_with)
    groups_with: list[str] = Field(default_factory=list)  # mode: groups; empty: groups with each other
    max_per_hop: int | None = Field(None, ge=1)  # refresh at most this many pairs per hop, stalest first

    @model_validator(mode="after")
    def _consistent(self) -> Pairs:
        if self.mode == "list" and not self.pairs:
            raise ValueError("mode 'list' needs a non-empty 'pairs' list of [a, b]")
        if self.mode == "groups" and not self.groups:
            raise ValueError("mode 'groups' needs 'groups' (and optionally 'groups_with')")
        return self


class Screening(_Strict):
    """Dependence screening: a cheap all-pairs statistic each hop decides where the network runs."""

    mode: Literal["auto", "on", "off"] = SCREENING  # auto: on when the pairs exceed the hop's network budget
    max_age_s: float = Field(MAX_AGE_S, gt=0)  # every pair gets a network estimate at least this often
    hop_budget: float = Field(HOP_BUDGET, gt=0, le=1)  # share of the hop the network may use


class EstimatorConfig(_Strict):
    device: Literal["cpu", "cuda", "auto"] = "auto"  # auto: CUDA when torch sees a GPU
    amp: bool | None = None  # bf16 autocast for the network; None: on where it pays (measured in bench.cpu_path)
    # torch.compile the network (true), or its ahead-of-time package for this CPU ("aot", streamcorr.estimate.aot);
    # None: torch.compile on CUDA, "aot" on a CPU (bench.gpu_path, bench.cpu_path)
    compile: bool | Literal["aot"] | None = None
    batch_size: int = Field(128, ge=1, le=65_536)  # pairs per network call
    threads: int | None = Field(None, ge=1)  # threads of the network and the rank kernels; None: all cores
    weights: str | None = None  # a shipped model (infonet-v1, infonet-v2) or a .safetensors path; None: infonet-v2
    # estimates above 1.5 nats refined by the chain rule over quantile slabs (windows >= 512; Estimator docstring)
    refine_high_mi: bool = True
    # ar: MI between the channels' innovations (residuals of a per-channel AR fit over the window): dependence of
    # the new information rather than of slow levels (streamcorr.estimate.significance.prewhiten); none: the samples
    prewhiten: Literal["none", "ar"] = "none"

    @field_validator("weights")
    @classmethod
    def _known_weights(cls, value: str | None) -> str | None:
        if value is None or value in SHIPPED_WEIGHTS or value.endswith(".safetensors"):
            return value
        names = ", ".join(SHIPPED_WEIGHTS)
        raise ValueError(f"use a shipped model ({names}; default {DEFAULT_WEIGHTS_NAME}) or a .safetensors path")


class Compute(_Strict):
    """Where pair MI is computed (streamcorr.compute.local): in the daemon's process, or on Ray actors."""

    backend: Literal["local", "ray"] = "local"  # ray: pip install -e ".[ray]"
    address: str | None = None  # ray: None starts a local instance; "auto" or "host:6379" joins a running cluster
    workers: int = Field(2, ge=1, le=4096)  # ray: actors, each holding the model once
    device: Literal["cpu", "cuda"] = "cpu"  # ray: each worker's device (cuda: one GPU per worker)
    cpus_per_worker: float = Field(1.0, gt=0, le=1024)  # ray: CPUs reserved per worker; its torch/Numba threads
    tile_pairs: int = Field(1024, ge=1, le=1 << 24)  # ray: pairs per task at most (GPU workers: tens of thousands)
    max_in_flight: int = Field(2, ge=1, le=64)  # ray: tiles queued or running per worker, at most
    hop_timeout_s: float | None = Field(None, gt=0, le=3600)  # ray: a hop's wait for its tiles (None: one hop)
    start_timeout_s: float = Field(120.0, gt=0, le=3600)  # ray: connect, and load the model on the workers


class Changes(_Strict):
    # chance became-dependent events an hour over the whole matrix; the per-pair rate follows from the number of
    # pairs, the hop and the window (streamcorr.estimate.significance.per_evaluation_rate)
    false_alarms_per_hour: float = Field(1.0, gt=0, le=1e6)
    false_alarm_rate: float | None = Field(None, gt=0, lt=MAX_FALSE_ALARM_RATE)  # per pair and hop (overrides that)
    # effective: the null at each pair's effective sample size (smooth signals); iid: white-noise data only
    significance: Literal["effective", "iid"] = "effective"
    # circularly shifted surrogates per smooth pair for its own null (streamcorr.estimate.surrogates); 0: table only
    surrogates: int = Field(20, ge=0, le=256)
    min_effect: float = Field(0.1, ge=0)  # nats: a pair must also exceed this to become dependent
    persist: int = Field(2, ge=1)  # evaluations in a row a change must hold before it is reported
    delta: float | None = Field(None, gt=0)  # nats for rise/fall (default: max(0.1, 6 x the null's std))
    rel_delta: float = Field(0.25, ge=0, lt=10)  # ... and this fraction of the pair's level
    fast: bool = True  # events seconds after a change, beside the window's (streamcorr.engine.fast); off: window only
    fast_window: int = Field(256, ge=64, le=4096)  # samples: the fast path's short window (<= window.samples / 4)


class Lags(_Strict):
    # the MI of x(t) against y(t + lag) for |lag| <= max_s and the best lag (streamcorr.engine.lags); 0: off.
    # Positive lag_s: the pair's second channel (matrix order) follows the first
    max_s: float = Field(0.0, ge=0, le=60)
    refresh_s: float = Field(2.0, gt=0)  # each pair's lag is searched again at least this often
    max_pairs_per_hop: int = Field(128, ge=1)  # pairs searched per hop at most: held dependent first, stalest first


class ZmqOutput(_Strict):
    # the XPUB socket snapshots, pairs, events and status leave on
    endpoint: str = Field("tcp://127.0.0.1:5556", pattern=r"^(tcp|ipc|inproc)://")
    bind: bool = True  # bind the endpoint (subscribers connect), or connect to a forwarder
    # REP socket answering late joiners with the newest snapshot, pairs and status; None: off
    snapshot_endpoint: str | None = Field("tcp://127.0.0.1:5557", pattern=r"^(tcp|ipc|inproc)://")
    prefix: str = "streamcorr"  # topics are {prefix}/snapshot, /pairs, /event, /status
    # bytes libzmq may hold for one subscriber: its high-water mark becomes max_queue_bytes // largest message - 1
    # (at least 1), so a subscriber that stops reading costs at most max(this, 2 x the largest message); what it
    # misses is counted, as a lower bound (streamcorr.publish.zmq_sink)
    max_queue_bytes: int = Field(8 << 20, ge=1 << 16, le=4 << 30)
    top_k: int | None = Field(None, ge=1)  # the pairs topic: the k strongest pairs of each snapshot
    threshold: float | None = None  # the pairs topic: pairs at or above this MI (nats)


class MqttOutput(MqttConnection):
    prefix: str = "streamcorr"  # topics are {prefix}/snapshot, /pairs, /event, /status
    retain_snapshot: bool = True  # the broker keeps the newest snapshot for late joiners
    # events waiting for the broker, at most (the oldest dropped, counted)
    queue_size: int = Field(256, ge=1, le=100_000)
    top_k: int | None = Field(None, ge=1)  # the pairs topic: the k strongest pairs of each snapshot
    threshold: float | None = None  # the pairs topic: pairs at or above this MI (nats)


class RecordOutput(_Strict):
    """Snapshots and events to Parquet files (streamcorr.publish.record), rotated, under a disk cap."""

    directory: str  # where the Parquet files go; streamcorr check fails when it cannot be written
    rotate_s: float = Field(60.0, gt=0, le=86_400)  # a crash loses at most this much
    max_bytes: int = Field(1 << 30, ge=1 << 16)  # the oldest files are deleted (and counted) beyond this
    top_k: int | None = Field(None, ge=1)  # None: every assessed pair per snapshot; k: the k strongest


class Outputs(_Strict):
    zmq: ZmqOutput | None = None
    mqtt: MqttOutput | None = None
    record: RecordOutput | None = None
    status_interval_s: float = Field(5.0, gt=0)  # seconds between status messages on every output


class Http(_Strict):
    """Prometheus /metrics, /healthz and (when outputs.web is enabled) the live page share one listener."""

    enabled: bool = True  # serve /metrics, /healthz, /livez, /readyz
    host: str = "127.0.0.1"  # the listener's address (beyond loopback: see Security and limits)
    port: int = Field(9108, ge=0, le=65535)  # 0: any free port
    web: bool = False  # serve the live web view at /
    # bytes waiting for one web client, the frame being written included: its newest snapshot and status are
    # kept, its oldest events dropped beyond this, counted (streamcorr.publish.outbox)
    web_max_queue_bytes: int = Field(8 << 20, ge=1 << 16, le=4 << 30)
    max_connections: int = Field(256, ge=1, le=65_536)  # open at once; more are closed at once
    header_timeout_s: float = Field(10.0, gt=0, le=3600)  # to send a request's headers (also between requests)
    snapshot_stale_s: float | None = Field(None, gt=0)  # /healthz: input flowing, no snapshot this long (auto)
    pair_metrics_top_k: int = Field(10, ge=0, le=100)  # /metrics streamcorr_pair_*: the k strongest pairs ...
    pair_metrics_listed: int = Field(100, ge=0, le=1000)  # ... and at most this many of pairs.pairs (mode list)


class Logging(_Strict):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"  # the least severe messages logged
    format: Literal["json", "text"] = "json"  # json: one JSON object per line; text: for a terminal
    max_repeats_per_10s: int = Field(20, ge=1)  # lines per logger and message template; the rest are counted


_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", "ip6-localhost"})  # one broker by several names


def _broker(c: MqttConnection) -> tuple[str, int]:
    host = c.host.strip().lower()
    return ("loopback" if host in _LOOPBACK else host), c.port


class Config(_Strict):
    version: Literal[1]  # the schema's version: write 1
    sources: list[Source] = Field(min_length=1)
    channels: Channels = Channels()
    window: Window = Window()
    pairs: Pairs = Pairs()
    screening: Screening = Screening()
    estimator: EstimatorConfig = EstimatorConfig()
    compute: Compute = Compute()
    changes: Changes = Changes()
    lags: Lags = Lags()
    outputs: Outputs = Outputs()
    http: Http = Http()
    logging: Logging = Logging()

    @model_validator(mode="after")
    def _no_output_loop(self) -> Config:
        """A source subscribed to the MQTT output's topics on its broker would ingest the daemon's own output."""
        from paho.mqtt.client import topic_matches_sub

        out = self.outputs.mqtt
        for k, src in enumerate(self.sources):
            if out is None or not isinstance(src, MqttSourceConfig) or _broker(src) != _broker(out):
                continue
            mine = [f"{out.prefix}/{stream}" for stream in ("snapshot", "pairs", "event", "status")]
            for pattern, hit in ((p, t) for p in src.topics for t in mine if topic_matches_sub(p, t)):
                raise ValueError(f"sources.{k}.topics: {pattern!r} matches the MQTT output's topic {hit!r}, so the "
                                 "daemon would read its own output; give outputs.mqtt.prefix a topic outside the "
                                 "sources' filters")  # fmt: skip
        return self

    def hop_samples(self) -> int:
        if self.window.hop_samples is not None:
            return self.window.hop_samples
        if self.window.hop_s is not None:
            return max(1, round(self.window.hop_s * self.channels.rate_hz))
        return max(1, round(HOP_S * self.channels.rate_hz))


def parse_config(data: Any, *, need_sources: bool = True) -> Config:
    """Validate a parsed YAML document; raises ConfigError naming each bad key. ``need_sources=False``
    (replay: the log is the input) accepts a file without ``sources``; the result then has none."""
    if not isinstance(data, dict):
        raise ConfigError("the configuration must be a mapping of keys (start with 'version: 1')")
    if _count_values(data, MAX_CONFIG_VALUES) > MAX_CONFIG_VALUES:
        msg = f"the configuration expands to more than {MAX_CONFIG_VALUES:,} values (YAML aliases?); write it out"
        raise ConfigError(msg)
    if "version" in data and data["version"] != SCHEMA_VERSION:
        raise ConfigError(f"version: this streamcorr reads version {SCHEMA_VERSION}; got {echo(data['version'])}")
    placeholder = not need_sources and not data.get("sources")
    if placeholder:  # one stand-in source satisfies the schema; nothing is built from it
        data = {**data, "sources": [{"type": "zmq", "endpoint": "inproc://unused"}]}
    try:
        cfg = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(describe(exc, Config)) from None
    return cfg.model_copy(update={"sources": []}) if placeholder else cfg


def load_config(path: str | Path, *, need_sources: bool = True) -> Config:
    """Read and validate a YAML configuration file (``need_sources``: as in ``parse_config``)."""
    p = Path(path)
    try:
        with p.open("rb") as f:  # bounded: /dev/zero or a log file passed by mistake must not fill memory
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{p} is larger than {MAX_CONFIG_BYTES >> 20} MiB: not a streamcorr configuration")
    try:
        data = yaml.safe_load(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p} is not valid YAML: {str(exc)[:500]}") from None
    except RecursionError:
        raise ConfigError(f"{p} nests too deeply to be a streamcorr configuration") from None
    try:
        return parse_config(data, need_sources=need_sources)
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None
