"""Sensors that watch the tombstone and benchmark fences."""
