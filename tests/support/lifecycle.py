"""Versions for lifecycle tests, built with the real writer, signer, catalog and gate.

``forge_release`` derives a signed release from a real one with a chosen subset of its
shard descriptors (v1 = {A, B}, v2 = {A, C} of the seed's example); the objects are the
real stored shard versions, so deleting one is a real deletion of an exact version.
"""

import copy

from support.releases import Forged, write

from relgate.catalog.audit import Approved
from relgate.catalog.release_table import get_release, insert_release
from relgate.catalog.states import transition
from relgate.documents import release_root as rm
from relgate.gate.approvals import sign_approval
from relgate.gate.transitions import open_gate
from relgate.runs.shard_fetch import object_key

RECORDS_PER_SHARD = 40


def release_of(ws, snapshot_digest, **kw):
    return write(ws, snapshot_digest, **kw)


def forge_release(ws, base, shard_ids, *, tag, insert=True):
    """A signed release over ``shard_ids`` of ``base``; STAGED in the catalog unless
    ``insert`` is false (then only its envelope is stored: publication outcome unknown)."""
    body = copy.deepcopy(base.document())
    body["shards"] = [d for d in body["shards"] if d["id"] in shard_ids]
    body["totals"] = {
        "shards": len(body["shards"]),
        "records": sum(d["records"] for d in body["shards"]),
        "tokens": sum(d["tokens"] for d in body["shards"]),
        "bytes": sum(d["size"] for d in body["shards"]),
    }
    body["writer"] = {**body["writer"], "sortSeed": f"{body['writer']['sortSeed']}/{tag}"}
    sealed = Forged(rm.seal_document(body))
    version = rm.store_envelope(ws.store, sealed.body, rm.sign(sealed.body, ws.signing_key))
    if insert:
        row = get_release(ws.db, base.digest)
        with ws.db.tx() as conn:
            insert_release(
                conn,
                sealed.body,
                members_digest=row.members_digest,
                members_version=row.members_version,
                envelope_version=version,
                actor="test",
            )
    return sealed


def set_state(ws, kind, digest, *states):
    with ws.db.tx() as conn:
        for state in states:
            transition(conn, kind, digest, state, actor="test", reason="test setup")


def publish(ws, digest, alias):
    """STAGED -> VERIFIED -> APPROVED, then the alias CAS through the gate."""
    set_state(ws, "release", digest, "VERIFIED", "APPROVED")
    sign_approval(
        ws,
        Approved(
            kind="release",
            digest=digest,
            state="APPROVED",
            approver="test",
            report="sha256:" + "0" * 64,
        ),
    )
    gate = open_gate(ws)
    generation = gate.alias(alias, "release").generation
    return gate.activate("release", alias, digest, expected_generation=generation, actor="test")


def shard_keys(release):
    return {
        d["id"]: (object_key(d), d["objectVersion"]) for d in rm.wire_shards(release.document())
    }


def candidate_set(plan):
    return {(c.key, c.version_id) for c in plan.candidates}


def stored_set(ws, prefix=""):
    return {(v.key, v.version_id) for v in ws.store.list_versions(prefix)}
