"""Checkpoints: publish a directory as a signed manifest, list them, distribute to a fleet."""
