"""A binary-with-metadata demo corpus (``relgate demo seed --corpus images``).

Small real PNG images (generated pixels, valid chunks and CRCs) as JSON-lines objects
under a versioned prefix: the image bytes in base64, its MIME type, width and height, a
quality score, an optional caption (null for some) and a class label.  The content is
the image bytes and their MIME type; the rest are attributes the shard stream binds.
Tokens are not counted for images (rule ``none``).
"""

from __future__ import annotations

import base64
import json
import random
import struct
import zlib
from typing import Final

from relgate.demo.corpus import SeededCorpus
from relgate.documents.policy import ColumnPredicate, PredicatePolicy
from relgate.records.record_schema import FieldSpec, RecordSchema, TokenRule
from relgate.workspace import Workspace

PREFIX: Final = "raw/images/"
SOURCE_ID: Final = "images"
LABELS: Final = ("cat", "dog", "bird", "noise")

IMAGE_RECORDS: Final = RecordSchema(
    name="relgate.demo.images.v1",
    fields=(
        FieldSpec(name="sampleId", type="string"),
        FieldSpec(name="image", type="binary"),
        FieldSpec(name="mime", type="string"),
        FieldSpec(name="width", type="int32"),
        FieldSpec(name="height", type="int32"),
        FieldSpec(name="score", type="float64"),
        FieldSpec(name="caption", type="string", nullable=True),
        FieldSpec(name="label", type="string"),
    ),
    content=("image", "mime"),
    tokens=TokenRule(kind="none"),
    label="label",
)
#: Members: labelled images (the "noise" class is left out).
IMAGE_SELECTION: Final = PredicatePolicy(
    predicates=(
        ColumnPredicate(column="label", any_of=("bird", "cat", "dog")),
        ColumnPredicate(column="image", min_length=1, max_length=1 << 20),
    )
)


def png(width: int, height: int, rng: random.Random) -> bytes:
    """A valid RGB PNG of random pixels."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    rows = b"".join(
        b"\x00" + bytes(rng.randrange(256) for _ in range(width * 3)) for _ in range(height)
    )
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows, 9))
        + chunk(b"IEND", b"")
    )


def _record(n: int, rng: random.Random) -> dict[str, object]:
    width, height = rng.choice((8, 12, 16)), rng.choice((8, 12, 16))
    label = LABELS[n % len(LABELS)]
    return {
        "id": f"{SOURCE_ID}/{n:07d}",
        "image": base64.b64encode(png(width, height, rng)).decode("ascii"),
        "mime": "image/png",
        "width": width,
        "height": height,
        "score": round(rng.random(), 6),
        "caption": None if n % 5 == 0 else f"a small picture of a {label}",
        "label": label,
    }


def seed_images(
    ws: Workspace, *, objects: int = 6, per_object: int = 40, seed: int = 7
) -> SeededCorpus:
    """Write the image objects and configure them as the workspace's only source."""
    rng = random.Random(seed)  # noqa: S311 - synthetic pixels, not a secret
    n = 0
    for obj in range(objects):
        lines = []
        for _ in range(per_object):
            lines.append(json.dumps(_record(n, rng)))
            n += 1
        ws.store.put(f"{PREFIX}batch-{obj:04d}.jsonl", ("\n".join(lines) + "\n").encode())
    ws.config["sources"] = [{"id": SOURCE_ID, "kind": "object-prefix", "prefix": PREFIX}]
    snapshot = ws.config.setdefault("snapshot", {})
    snapshot["recordSchema"] = IMAGE_RECORDS.to_json()
    snapshot["selection"] = IMAGE_SELECTION.to_json()
    snapshot["transform"] = "registry.local/identity:v1"
    ws.save()
    return SeededCorpus(tickets=0, forum_records=n, chat_events=0, sources=[SOURCE_ID])
