"""One exception hierarchy for the agent package; every message names the object and the check."""

from __future__ import annotations

import errno

from relgate_trust.errors import TrustError

# error kinds an agent reports that end a job (CHUNK_FAILED: a chunk failed verification N
# times from the origin or from two peers) or its own part in one (HOST_FAILED)
KIND_CHUNK_FAILED = "CHUNK_FAILED"
KIND_HOST_FAILED = "HOST_FAILED"
# what a quarantined host reports after it scrubbed its staging and re-verified its versions
KIND_QUARANTINED = "QUARANTINED"
# a chunk held by another local version whose bytes no longer match the signed digest: not
# copied (the chunk comes over the network); reported, never fatal
KIND_LOCAL_REJECTED = "LOCAL_COPY_REJECTED"
#: this host has no room for the job (free disk before staging, or ENOSPC/EDQUOT/EFBIG while
#: staging): it frees its staging and stops; the coordinator removes it from the job
KIND_NO_SPACE = "NO_SPACE"
#: the job's manifest failed this host's own verification (the check is named in the detail)
KIND_MANIFEST_REJECTED = "MANIFEST_REJECTED"
#: gRPC trailing-metadata key under which the coordinator names the check a refusal failed;
#: clients read the check from here, never from the message text.
CHECK_METADATA_KEY = "relgate-check"
# the address of the coordinator replica that leads the job a refused call named (sharded
# coordinators answer UNAVAILABLE with it; rpc.FailoverStub calls that replica next)
LEADER_METADATA_KEY = "relgate-leader"


#: The agent's errors are rooted in the shared trust layer's: a manifest, signature or
#: path refused by relgate_trust (ManifestError, VerificationError, ...) is an agent error.
AgentError = TrustError


class OriginError(AgentError):
    """A ranged read from the checkpoint origin failed or returned the wrong length."""


class StorageError(AgentError):
    """Local staging or placement failed (no space, bad journal, rename failure)."""


class NoSpace(StorageError):
    """The staging file system is full (or a file size limit was hit) while writing."""


_NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def is_no_space(exc: BaseException) -> bool:
    """A write failed for lack of room: ENOSPC, EDQUOT, or EFBIG (RLIMIT_FSIZE)."""
    return isinstance(exc, NoSpace) or (isinstance(exc, OSError) and exc.errno in _NO_SPACE_ERRNOS)
