"""Shared gRPC settings (kept import-light: agents must not pull in the coordinator)."""

from __future__ import annotations

# Manifests of 800 GB checkpoints are a few MB; leave headroom.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]
