"""A pre-tokenized demo corpus (``relgate demo seed --corpus tokens``).

Seed 004's planning case stores token ids as unsigned 32-bit integers.  This corpus is
the demo's text, tokenized with the BPE tokenizer trained on it, in an Iceberg table
``corpus.tokenized`` (``sample_id``, ``ids: list<long>``, ``domain``; Iceberg has no
unsigned types, so the record schema's ``list<uint32>`` is reached by a lossless cast
that refuses any id outside the range).  Records carry no text; token counts are exact
(the number of ids).
"""

from __future__ import annotations

import random
from typing import Final

import pyarrow as pa
from pyiceberg.table import Table
from tokenizers import Tokenizer

from relgate.demo.corpus import LANGS, SeededCorpus, Texts, trained_tokenizer
from relgate.documents.policy import ColumnPredicate, PredicatePolicy
from relgate.records.record_schema import FieldSpec, RecordSchema, TokenRule
from relgate.sources.iceberg import open_catalog
from relgate.workspace import Workspace

TABLE: Final = "corpus.tokenized"
SOURCE_ID: Final = "tokens-eu"
DOMAINS: Final = ("support", "billing", "shipping")

TOKEN_RECORDS: Final = RecordSchema(
    name="relgate.demo.tokens.v1",
    fields=(
        FieldSpec(name="sampleId", type="string"),
        FieldSpec(name="ids", type="list<uint32>"),
        FieldSpec(name="domain", type="string"),
    ),
    content=("ids",),
    tokens=TokenRule(kind="token-ids", column="ids"),
    label="domain",
)
#: Members need at least 8 tokens (the short "ok thx" records fall out).
TOKEN_SELECTION: Final = PredicatePolicy(
    predicates=(ColumnPredicate(column="ids", min_length=8, max_length=4096),)
)


def seed_tokens(ws: Workspace, *, records: int = 600, seed: int = 7) -> SeededCorpus:
    """Write the tokenized table and configure it as the workspace's only source."""
    rng = random.Random(seed)  # noqa: S311 - synthetic text, not a secret
    say = Texts(rng)
    texts = [say(rng.choice(LANGS)) for _ in range(records)]
    tokenizer = Tokenizer.from_str(trained_tokenizer(tuple(texts)).decode("utf-8"))
    ids = [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    table = _table(ws)
    table.append(
        pa.table(
            {
                "sample_id": [f"{SOURCE_ID}/{i:07d}" for i in range(records)],
                "ids": pa.array(ids, pa.list_(pa.int64())),
                "domain": [DOMAINS[i % len(DOMAINS)] for i in range(records)],
            },
            schema=_ICEBERG_SCHEMA,
        )
    )
    ws.config["sources"] = [
        {
            "id": SOURCE_ID,
            "kind": "iceberg",
            "catalogUri": _catalog_uri(ws),
            "warehouse": _warehouse(ws),
            "table": TABLE,
        }
    ]
    snapshot = ws.config.setdefault("snapshot", {})
    snapshot["recordSchema"] = TOKEN_RECORDS.to_json()
    snapshot["selection"] = TOKEN_SELECTION.to_json()
    snapshot["transform"] = "registry.local/identity:v1"
    ws.save()
    return SeededCorpus(tickets=records, forum_records=0, chat_events=0, sources=[SOURCE_ID])


_ICEBERG_SCHEMA = pa.schema(
    [("sample_id", pa.string()), ("ids", pa.list_(pa.int64())), ("domain", pa.string())]
)


def _catalog_uri(ws: Workspace) -> str:
    return f"sqlite:///{ws.home / 'iceberg' / 'catalog.db'}"


def _warehouse(ws: Workspace) -> str:
    return f"file://{ws.home / 'iceberg' / 'warehouse'}"


def _table(ws: Workspace) -> Table:
    (ws.home / "iceberg" / "warehouse").mkdir(parents=True, exist_ok=True)
    catalog = open_catalog(_catalog_uri(ws), _warehouse(ws))
    if ("corpus",) not in catalog.list_namespaces():
        catalog.create_namespace("corpus")
    if catalog.table_exists(TABLE):
        catalog.drop_table(TABLE)
    return catalog.create_table(TABLE, schema=_ICEBERG_SCHEMA)
