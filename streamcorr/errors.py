"""The one exception family raised by streamcorr."""

from __future__ import annotations


class StreamcorrError(Exception):
    """Base class of every error streamcorr raises on purpose."""


class ConfigError(StreamcorrError):
    """A configuration value is missing, malformed or out of range."""


class InputError(StreamcorrError, ValueError):
    """Data handed to the library has the wrong shape, length or values."""


class ModelLoadError(StreamcorrError):
    """Model weights are missing, corrupt, or do not match the architecture."""
