"""Shard releases: writer, independent verifier, publication, permits and runs."""
