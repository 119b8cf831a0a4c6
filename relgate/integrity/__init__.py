"""Integrity: canonical JSON, digests, per-row hashing, Merkle trees, member tuples, signing.

Every rule that makes a byte trustworthy lives here once: the canonical encoding, the digest
spelling, the DSSE envelope (through :mod:`relgate_trust.dsse`, shared with the agent), the
signed-document seal and the identifier rule.  Nothing here reads a database or a store.
"""
