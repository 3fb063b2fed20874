"""Plumbing per protocol shared by the two sides of a transport (sources in ``ingest``, sinks and the Subscriber in
``publish``): ``mqtt`` (client factory, backoff, one reconnecting loop with its counters), ``zmq`` (sockets) and
``http`` (the guard on the daemon's HTTP listener: connection cap, header timeout)."""
