"""relgate-agent: host agent and coordinator for checkpoint distribution (the network lab
and fault injection live outside this package, in agent/lab/relgate_lab).

The library surface the main package uses (``relgate checkpoint publish`` and the Dagster
Pipes launch) is re-exported here; everything else is reachable through its module.
"""

from relgate_trust.errors import ManifestError, VerificationError
from relgate_trust.manifest import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CHUNK_SIZE,
    PAYLOAD_TYPE,
    CheckpointManifest,
    TrustedKeys,
    build_manifest,
    envelope_bytes,
    keyid_for,
    load_private_key,
    manifest_digest,
    sign_manifest,
    verify_envelope,
    write_envelope,
)

from relgate_agent.dataplane.origin import open_origin, read_uri
from relgate_agent.errors import AgentError, OriginError, StorageError

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_CHUNK_SIZE",
    "PAYLOAD_TYPE",
    "AgentError",
    "CheckpointManifest",
    "ManifestError",
    "OriginError",
    "StorageError",
    "TrustedKeys",
    "VerificationError",
    "build_manifest",
    "envelope_bytes",
    "keyid_for",
    "load_private_key",
    "manifest_digest",
    "open_origin",
    "read_uri",
    "sign_manifest",
    "verify_envelope",
    "write_envelope",
]
