"""Every numeric entry of every counters ledger has its /metrics series declared in streamcorr.daemon.series, so
a new or renamed field cannot go unserved or rename a series."""

from __future__ import annotations

import re

from streamcorr.counters import flat_counters
from streamcorr.daemon import series
from streamcorr.engine.intake import EngineCounters
from streamcorr.ingest.source import IngestCounters
from streamcorr.publish.record import RecorderCounters
from streamcorr.publish.sinks import SinkCounters

# entries served by the labelled series that observe builds (messages, samples by source, drops by reason, ...)
INGEST_LABELLED = {"messages", "samples_handed", "queue_full"}
ENGINE_ELSEWHERE = {"unknown_channel", "bad_name", "channel_limit", "future", "bad_sample", "last_hop_s"}


def _top(counters: object) -> set[str]:
    return {k for k in flat_counters(counters) if "." not in k}


def test_every_engine_entry_has_a_series():
    """Each EngineCounters entry is a declared series, a kind of streamcorr_engine_dropped or a sample drop."""
    missing = _top(EngineCounters()) - set(series.ENGINE) - series.ENGINE_LOST - ENGINE_ELSEWHERE
    assert not missing


def test_every_ingest_entry_has_a_series():
    """Each IngestCounters entry is a declared series or one of the labelled ingest series."""
    assert not _top(IngestCounters()) - set(series.INGEST) - INGEST_LABELLED


def test_every_output_ledger_entry_has_a_series():
    """The ZeroMQ, web and record outputs' own ledger entries are all declared."""
    from streamcorr.daemon.observe import output_ledger
    from streamcorr.publish.web import WebView
    from streamcorr.publish.zmq_sink import ZmqPublisher

    ledgers = [
        output_ledger(ZmqPublisher(endpoint="tcp://127.0.0.1:0").counters),
        output_ledger(WebView().counters),
        output_ledger(RecorderCounters()),
    ]
    for ledger in ledgers:
        assert set(ledger) <= set(series.OUTPUT), set(ledger) - set(series.OUTPUT)
    assert set(series.OUTPUT) >= series.OUTPUT_GAUGES
    assert output_ledger(SinkCounters()) == {}  # the shared entries are streamcorr_output_* series


def test_series_names_are_unique_and_prometheus_shaped():
    """No two entries share a series; names are lower snake case with the streamcorr_ prefix."""
    names = [name for name, _ in [*series.ENGINE.values(), *series.INGEST.values()]]
    assert len(names) == len(set(names))
    assert all(re.fullmatch(r"streamcorr_[a-z0-9_]+", n) for n in names)
    assert all(re.fullmatch(r"[a-z0-9_]+", suffix) for suffix, _ in series.OUTPUT.values())
