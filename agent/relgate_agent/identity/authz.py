"""Authorization rules of both planes, written once (pure functions over verified identities).

The TLS stacks (gRPC, ``ssl``) authenticate: a peer without a certificate from the fleet CA
never gets here. These functions decide what an authenticated identity may do. Each returns
a refusal text (the caller logs it, counts it and sends it back), or None when allowed.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from relgate_agent.identity import crlwire
from relgate_agent.pki import ROLE_HOST, ROLE_OPERATOR, Identity

# how an authorization refusal of a job member whose topology differs from ours begins: the
# two hosts are a moment apart (one has the new assignment, the other not yet); the member
# asks again once both agree, and the refusal is never counted with an attack's
STALE_TOPOLOGY = "stale topology"

# control plane: which role may call what
OPERATOR_METHODS = (
    frozenset(
        {
            "CreateJob",
            "GetJob",
            "CancelJob",
            "EvictHost",
            "ClearHost",
            "EnrollHost",
            "ListHosts",
            "ListJobs",
            "GetJobTopology",
            "CreateEnrollToken",
            "ListEnrollRequests",
            "ApproveEnrollment",
        }
    )
    | crlwire.OPERATOR_RPCS
)  # the revocation list's RPCs (identity/crlwire.py)
AGENT_METHODS = (
    frozenset(
        {
            "Watch",
            "Register",
            "ReportProgress",
            "ReportStream",
            "ReportSuspect",
            "FindPeers",
            "RenewCert",
            "TrustBundle",
        }
    )
    | crlwire.AGENT_RPCS
)


def rpc_refusal(
    method: str, caller: Identity | None, host_id: str = "", rack: str = ""
) -> str | None:
    """Operators call operator RPCs; a host calls agent RPCs only as the host (and rack) its
    certificate names."""
    refused = rpc_check(method, caller, host_id, rack)
    return None if refused is None else refused[1]


# the checks :func:`rpc_check` names (sent to the client with the refusal)
CHECK_CLIENT_IDENTITY = "client-identity"
CHECK_OPERATOR_ROLE = "operator-role"
CHECK_AGENT_ROLE = "agent-role"
CHECK_HOST_IDENTITY = "host-identity"
CHECK_HOST_RACK = "host-rack"
CHECK_RPC_METHOD = "rpc-method"


def rpc_check(  # noqa: PLR0911 - one return per refusal rule, in order
    method: str, caller: Identity | None, host_id: str = "", rack: str = ""
) -> tuple[str, str] | None:
    """:func:`rpc_refusal` with the check that refused: (check, refusal text), or None."""
    if caller is None:
        return (
            CHECK_CLIENT_IDENTITY,
            f"{method} refused: the client certificate carries no relgate identity",
        )
    if method in OPERATOR_METHODS:
        if caller.role != ROLE_OPERATOR:
            return CHECK_OPERATOR_ROLE, f"{method} refused: operator RPC, caller is {caller}"
        return None
    if method in AGENT_METHODS:
        if caller.role != ROLE_HOST:
            return CHECK_AGENT_ROLE, f"{method} refused: agent RPC, caller is {caller}"
        if host_id != caller.name:
            return (
                CHECK_HOST_IDENTITY,
                f"{method} refused: certificate is for host {caller.name}, request names host {host_id!r}",
            )
        if rack and rack != caller.rack:
            return (
                CHECK_HOST_RACK,
                f"{method} refused: certificate is for rack {caller.rack}, request names rack {rack!r}",
            )
        return None
    return CHECK_RPC_METHOD, f"{method} refused: unknown method"


def ready_refusal(
    verified: int, num_chunks: int, placed_digest: str, manifest_digest: str
) -> str | None:
    """A host is READY only with every chunk verified and the placed tree's manifest digest."""
    if verified != num_chunks:
        return f"READY refused: {verified}/{num_chunks} chunks verified"
    if not placed_digest or placed_digest != manifest_digest:
        return f"READY refused: placed digest {placed_digest or '(none)'} is not {manifest_digest}"
    return None


def stripe_refusal(
    peer: Identity | None,
    job: str,
    stripe: int,
    downstreams: Collection[str] | None,
    topology_version: int,
) -> str | None:
    """StreamStripe: only to a host the current topology makes a downstream of this stripe."""
    if peer is None or peer.role != ROLE_HOST:
        return f"refused: peer {peer} is not a host"
    if downstreams is None or peer.name not in downstreams:
        return (
            f"refused: {peer.name} is not a downstream of stripe {stripe} of job {job} "
            f"(topology v{topology_version})"
        )
    return None


def chunk_refusal(
    peer: Identity | None, job: str, members: Collection[str], topology_version: int
) -> str | None:
    """FetchChunk: only to a host of this job's current topology (a swarm peer)."""
    if peer is None or peer.role != ROLE_HOST:
        return f"refused: peer {peer} is not a host"
    if peer.name not in members:
        return f"refused: {peer.name} is not a peer of job {job} (topology v{topology_version})"
    return None


def topology_skew(why: str, member: bool, peer_version: int, our_version: int, floor: int) -> str:
    """A refusal of a job member (``member``: in our topology's member set) whose topology
    version is not ours is a skew, not an attack: marked :data:`STALE_TOPOLOGY`.

    ``floor`` is the version our registration told us to act on (our assignment is cleared
    until it arrives, so our own ``our_version`` is already out of date below it). A peer
    behind ``max(our_version, floor)`` dials an upstream it had a moment ago; a peer ahead
    of ``our_version`` (we waited for its version, bounded, and it has not come) holds an
    assignment we do not have yet. A host outside the job, or a peer claiming no version,
    keeps the plain refusal."""
    if not member or peer_version <= 0:
        return why
    ours = max(our_version, floor)
    if peer_version < ours:
        return f"{STALE_TOPOLOGY} v{peer_version} < v{ours}: {why}"
    if peer_version > our_version:
        return f"{STALE_TOPOLOGY} here v{our_version} < v{peer_version}: {why}"
    return why


def live_targets(
    enrolled: Mapping[str, tuple[str, Mapping[str, str]]],
    last_seen: Mapping[str, float],
    now: float,
    ttl_s: float,
    selector: Mapping[str, str],
) -> dict[str, str]:
    """Targets of a new job: enrolled hosts (host -> (rack, labels)) that match the selector
    and sent a heartbeat within ``ttl_s``. Callers that never enrolled are not in the map."""
    out: dict[str, str] = {}
    for host, (rack, labels) in enrolled.items():
        seen = last_seen.get(host)
        if seen is None or now - seen > ttl_s:
            continue
        merged = {**labels, "rack": rack}
        if all(merged.get(k) == v for k, v in selector.items()):
            out[host] = rack
    return out
