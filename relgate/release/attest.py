"""In-toto Statement v1 with an SLSA provenance v1 predicate for a verified release.

The subject is the root manifest (name ``release-root``, digest ``sha256`` of the root):
approvers and permits name that digest, never a mutable directory.  The build definition
records what the writer was asked to do (snapshot, sort seed, sharding function,
compression, key version) and the resolved dependencies are the snapshot manifest and
every shard object by digest and exact version.  The verification report that admitted
the release is listed as a byproduct, so statement, report and root are bound together.
Signed as a DSSE envelope (``application/vnd.in-toto+json``) with the workspace key.
"""

from __future__ import annotations

from typing import Any

from relgate import __version__
from relgate.integrity.canonical import canonical_bytes
from relgate.integrity.signing import SigningKey, sign_envelope

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
BUILD_TYPE = "https://relgate.dev/shard-release/writer/v1"
VERIFIER_ID = "https://relgate.dev/shard-release/verifier/v1"


def _hex(digest: str) -> str:
    return digest.removeprefix("sha256:")


def release_statement(
    root: str, body: dict[str, Any], *, report_digest: str, verifier_id: str
) -> dict[str, Any]:
    writer = body.get("writer", {})
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": "release-root", "digest": {"sha256": _hex(root)}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "datasetSnapshot": body["datasetSnapshot"],
                    "tombstoneWatermark": body["tombstoneWatermark"],
                    "benchmarkFence": body["benchmarkFence"],
                    "recordSchema": body["recordSchema"],
                },
                "internalParameters": {
                    "sortSeed": writer.get("sortSeed"),
                    "shardingFunction": writer.get("shardingFunction"),
                    "compression": writer.get("compression"),
                    "serializer": writer.get("serializer"),
                    "keyVersion": writer.get("keyVersion"),
                },
                "resolvedDependencies": [
                    {
                        "name": "dataset-snapshot",
                        "digest": {"sha256": _hex(body["datasetSnapshot"])},
                    },
                    *(
                        {
                            "name": d["id"],
                            "digest": {"sha256": _hex(d["digest"])},
                            "annotations": {"objectVersion": d["objectVersion"]},
                        }
                        for d in body["shards"]
                    ),
                ],
            },
            "runDetails": {
                "builder": {"id": verifier_id, "version": {"relgate": __version__}},
                "metadata": {"invocationId": f"verify:{root}"},
                "byproducts": [
                    {
                        "name": "verification-report",
                        "digest": {"sha256": _hex(report_digest)},
                        "mediaType": "application/vnd.relgate.release-verification.v1+json",
                    }
                ],
            },
        },
    }


def sign_statement(statement: dict[str, Any], key: SigningKey) -> dict[str, Any]:
    return sign_envelope(PAYLOAD_TYPE, canonical_bytes(statement), key)
