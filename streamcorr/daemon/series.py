"""The /metrics series read from a counters ledger, declared once: for each ledger entry, its series name and help
text. A series is named here, never derived from a field's name, so renaming a field cannot rename a series;
``tests/daemon/test_series.py`` checks that every numeric entry of every ledger has a line here (an entry without one
is not served).

The series with labels (samples by source, drops by stage and reason, messages by output and stream, ...) and the
compute backend's (``streamcorr.compute.local.COUNTER_HELP``) are built in :mod:`streamcorr.daemon.observe`.
"""

from __future__ import annotations

__all__ = ["ENGINE", "ENGINE_LOST", "INGEST", "OUTPUT", "OUTPUT_GAUGES"]

# EngineCounters entry -> (series, help), one series each
ENGINE: dict[str, tuple[str, str]] = {
    "hops": ("streamcorr_hops", "Windows evaluated"),
    "hops_skipped": ("streamcorr_hops_skipped", "Hops superseded because compute was behind"),
    "hops_in_gaps": ("streamcorr_hops_in_gaps",
                     "Hops passed over because no channel had a sample (a pause of the stream, or a clock jump)"),
    "pairs_evaluated": ("streamcorr_pairs_evaluated", "Pair estimates made"),
    "channels_retired": ("streamcorr_channels_retired",
                         "Auto-added channels retired after channels.retire_after_s of silence"),
    "channels_reanchored": ("streamcorr_channels_reanchored",
                            "Channels whose clock stepped, re-anchored (channels.reanchor_after_s)"),
    "pairs_screened": ("streamcorr_engine_pairs_screened", "Pairs the dependence screen assessed (not picked)"),
    "screen_passed": ("streamcorr_engine_screen_passed", "Pairs that passed the dependence screen"),
    "max_age_overdue": ("streamcorr_engine_max_age_overdue",
                        "Pairs due for their screening.max_age_s network estimate that did not fit the hop's budget"),
    "screen_deferred": ("streamcorr_engine_screen_deferred",
                        "Pairs that passed the screen but did not fit the hop's budget (they wait)"),
}  # fmt: skip
# EngineCounters entries in streamcorr_engine_dropped{kind}; the engine's sample drops (unknown_channel, bad_name,
# channel_limit, future, bad_sample) are in streamcorr_samples_dropped{stage="engine"}; stage_s feeds
# streamcorr_stage_seconds and each hop's time the daemon's streamcorr_hop_seconds histogram
ENGINE_LOST = frozenset({"snapshots_dropped", "events_dropped", "pairs_low_coverage"})

# IngestCounters entry -> (series, help), labelled by source; messages, samples_handed, drops and queue_full are in
# streamcorr_messages_received, streamcorr_samples_ingested and streamcorr_samples_dropped
INGEST: dict[str, tuple[str, str]] = {
    "samples_decoded": ("streamcorr_source_samples_decoded", "Samples decoded from messages"),
    "samples_accepted": ("streamcorr_source_samples_accepted", "Samples the engine accepted"),
    "sink_errors": ("streamcorr_source_sink_errors", "Engine calls that raised (their samples handed, not accepted)"),
    "seq_gaps": ("streamcorr_source_seq_gaps",
                 "Messages missing by the payloads' seq numbers (lost before reaching streamcorr)"),
    "seq_resets": ("streamcorr_source_seq_resets", "Times a payload seq went back (a publisher restart)"),
    "connects": ("streamcorr_source_connects", "Connections made"),
    "disconnects": ("streamcorr_source_disconnects", "Connections lost"),
    "connect_failures": ("streamcorr_source_connect_failures", "Connection attempts that failed"),
}  # fmt: skip

# An output's own ledger entry (SinkCounters.extra, or a field a subclass adds) -> (series after streamcorr_<output>_,
# help); the shared entries (sent, dropped, connects, ...) are in streamcorr_output_*
OUTPUT: dict[str, tuple[str, str]] = {
    # zmq
    "queued_bytes": ("queued_bytes", "Bytes waiting for this output's clients now (libzmq or the web outboxes)"),
    "subscriptions": ("subscriptions", "Topics subscribed now, over all subscribers"),
    "queue_limit_messages": ("queue_limit_messages", "The high-water mark per subscriber, messages"),
    "rebinds": ("rebinds", "Times the PUB socket was bound again after it failed"),
    # web
    "clients": ("clients", "Browsers connected now"),
    "clients_total": ("clients_total", "Browsers that connected"),
    "clients_rejected": ("clients_rejected", "Browsers refused: over http.web_max_clients, or stopping"),
    "clients_timed_out": ("clients_timed_out", "Browsers dropped after one frame stuck past the send timeout"),
    "messages_sent": ("messages_sent", "Messages sent to browsers"),
    "snapshots_dropped": ("snapshots_dropped", "Snapshots replaced in an outbox before they were sent"),
    "stats_dropped": ("stats_dropped", "Status lines replaced in an outbox before they were sent"),
    "events_dropped": ("events_dropped", "Events lost: dropped from a full outbox (web), in unwritable files (record)"),
    "bad_requests": ("bad_requests", "/api/pair requests with missing or unknown names"),
    "table_errors": ("table_errors", "/api/pair requests whose lookup table failed"),
    "table_busy": ("table_busy", "/api/pair requests answered 503 while one was computed"),
    # record
    "rows_written": ("rows_written", "Timeline rows in closed files"),
    "events_written": ("events_written", "Events in closed files"),
    "files_closed": ("files_closed", "Parquet files closed"),
    "files_deleted": ("files_deleted", "Files deleted by the disk cap, oldest first"),
    "rows_deleted": ("rows_deleted", "Timeline rows in files deleted by the disk cap"),
    "events_deleted": ("events_deleted", "Events in files deleted by the disk cap"),
    "bytes_on_disk": ("bytes_on_disk", "Bytes of the recorder's closed files in its directory"),
    "write_errors": ("write_errors", "Files that could not be written"),
    "rows_dropped": ("rows_dropped", "Timeline rows in files that could not be written"),
}
OUTPUT_GAUGES = frozenset({"clients", "bytes_on_disk", "queued_bytes", "subscriptions", "queue_limit_messages"})
