"""Live MI matrix state, change detection, and (later) its sinks."""

from .changes import ChangeDetector, ChangeEvent, NullCalibration
from .snapshot import MatrixState, Snapshot

__all__ = ["ChangeDetector", "ChangeEvent", "MatrixState", "NullCalibration", "Snapshot"]
