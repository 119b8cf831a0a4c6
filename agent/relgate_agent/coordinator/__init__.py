"""Coordinator: job state (``jobstate``), leadership and shared state (``leader``), agent calls
(``progress``), the sweeper and webhook (``handoff``), operator calls (``service``), chain
planning (``topology``), the durable ``store`` and the gRPC ``server``."""
