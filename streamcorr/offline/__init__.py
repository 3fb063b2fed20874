"""Recorded logs: ``logs`` opens CSV, Parquet, MCAP and ROS bags (``log_tables`` is the one table reader,
``log_messages`` the message logs, ``recording`` the series they yield); ``replay`` runs them through the engine;
``report`` (with ``report_input`` and ``report_theta``) draws a replay's or recording's output as a self-contained
HTML page; ``outfiles`` writes output files atomically.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

_LAZY = {
    "open_log": "logs",
    "read_table": "logs",
    "replay": "replay",
    "ReplayResult": "replay",
    "write_report": "report",
}
__all__ = ["ReplayResult", "open_log", "read_table", "replay", "write_report"]

if TYPE_CHECKING:
    from .logs import open_log, read_table
    from .replay import ReplayResult, replay
    from .report import write_report

__getattr__ = lazy_getattr(__name__, __package__, _LAZY)
