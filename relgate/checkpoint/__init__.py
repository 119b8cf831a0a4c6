"""Checkpoints: publish a directory as a signed manifest, list what is published, distribute it."""
