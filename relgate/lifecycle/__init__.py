"""Dataset lifecycle: sizing, pins, leases, retention and fail-closed garbage collection."""
