"""Shard releases: the writer, the independent verifier (:mod:`relgate.release.verify`),
publication through the gate, encryption, schema evolution, proofs and metrics.
Training runs on a published root live in :mod:`relgate.runs`."""
