"""Outputs: the Sink protocol and forward(), the message envelope, the ZeroMQ / MQTT / Parquet / web sinks
and the Subscriber client. Outputs depend on the engine's results (streamcorr.engine.matrix, streamcorr.engine.changes),
never the other way; each module is imported where it is used, so naming one transport loads no other.
"""
