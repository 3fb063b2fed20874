"""Transports in: MQTT (aiomqtt) and ZeroMQ (pyzmq), decoding payloads into engine samples."""
