"""A realistic synthetic corpus in all three source kinds (``relgate demo seed``).

* ``tickets-eu``: support tickets in an Iceberg table (SQL catalog on SQLite), appended in
  two commits so the table has history;
* ``forum``: forum threads as JSON-lines objects under a versioned prefix, one edited
  after upload (a second version under the same name);
* ``chat-cdc``: chat transcripts as a CDC change log with upserts and deletes.

Text is generated from templates with a seeded RNG: deterministic, multilingual, with some
records too short to pass selection so the policy has something to do.
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path

import pyarrow as pa

from relgate.demo.normalizer import register_demo_transforms
from relgate.integrity.contract import Contract, JsonObject, JsonValue
from relgate.objects.versioned import ObjectStore
from relgate.records.record_schema import TEXT_SCHEMA, RecordSchema, TokenRule
from relgate.snapshot import tokenizer
from relgate.sources.cdc import append_segment
from relgate.sources.iceberg import open_catalog
from relgate.workspace import Workspace

PRODUCTS = [
    "router",
    "thermostat",
    "e-bike",
    "espresso machine",
    "headset",
    "smart lock",
    "dashcam",
    "drone",
]
ISSUES = [
    "stops responding after the latest firmware update",
    "shows error code E{code} on start-up",
    "drains the battery within {hours} hours",
    "cannot pair with the mobile app",
    "makes a clicking noise when {action}",
    "loses its settings after a power cut",
]
ACTIONS = ["charging", "booting", "idle", "under load", "cooling down"]
OPENERS = {
    "en": ["Hello team,", "Hi,", "Good morning,", "Dear support,"],
    "de": ["Hallo Team,", "Guten Tag,", "Sehr geehrte Damen und Herren,"],
    "fr": ["Bonjour,", "Madame, Monsieur,", "Salut l'équipe,"],
}
BODIES = {
    "en": "my {product} {issue}. I already tried a factory reset. Order number {order}.",
    "de": "mein {product} {issue}. Ein Werksreset hat nicht geholfen. Bestellnummer {order}.",
    "fr": "mon {product} {issue}. J'ai déjà essayé une réinitialisation. Commande {order}.",
}
LANGS = ["en", "en", "en", "de", "fr", "es"]  # es is outside the default selection
#: Share of texts too short for the default selection policy.
TOO_SHORT_SHARE = 0.04
#: Share of texts with doubled whitespace (for the normalize transform).
MESSY_SHARE = 0.2
#: Share of CDC events that delete a live transcript.
DELETE_SHARE = 0.1


def _text(rng: random.Random, lang: str) -> str:
    if rng.random() < TOO_SHORT_SHARE:
        return "ok thx"  # too short for the default selection policy
    issue = rng.choice(ISSUES).format(
        code=rng.randint(100, 999), hours=rng.randint(2, 12), action=rng.choice(ACTIONS)
    )
    body = BODIES.get(lang, BODIES["en"]).format(
        product=rng.choice(PRODUCTS), issue=issue, order=rng.randint(10**6, 10**7)
    )
    opener = rng.choice(OPENERS.get(lang, OPENERS["en"]))
    spacing = "  " if rng.random() < MESSY_SHARE else " "  # messy whitespace for the transform
    return f"{opener}{spacing}{body}"


class SeedOptions(Contract):
    """How much of each source kind ``seed_demo`` writes, and the RNG seed."""

    tickets: int = 600
    forum_objects: int = 12
    per_object: int = 40
    chat_events: int = 300
    seed: int = 7


class SeededCorpus(Contract):
    """What ``relgate demo seed`` wrote: record counts and the configured source ids."""

    tickets: int
    forum_records: int
    chat_events: int
    sources: list[str]


class Texts:
    """The generator of sample text, remembering what it wrote (to train the tokenizer)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.written: list[str] = []

    def __call__(self, lang: str) -> str:
        text = _text(self.rng, lang)
        self.written.append(text)
        return text


#: The demo's three sources as its config declares them (``seed_corpus`` adds the Iceberg
#: catalog's machine paths); the Dagster layer declares one external asset per entry.
TICKETS_SOURCE: JsonObject = {"id": "tickets-eu", "kind": "iceberg", "table": "corpus.tickets"}
FORUM_SOURCE: JsonObject = {"id": "forum", "kind": "object-prefix", "prefix": "raw/forum/"}
CHAT_SOURCE: JsonObject = {"id": "chat-cdc", "kind": "cdc", "prefix": "cdc/chat/"}
DEMO_SOURCES: tuple[JsonObject, ...] = (TICKETS_SOURCE, FORUM_SOURCE, CHAT_SOURCE)


def _seed_tickets(home: Path, rng: random.Random, tickets: int, say: Texts) -> JsonObject:
    """The Iceberg table, appended in two commits; returns its source config."""
    catalog_uri = f"sqlite:///{home / 'iceberg' / 'catalog.db'}"
    warehouse = f"file://{home / 'iceberg' / 'warehouse'}"
    (home / "iceberg" / "warehouse").mkdir(parents=True, exist_ok=True)
    catalog = open_catalog(catalog_uri, warehouse)
    if ("corpus",) not in catalog.list_namespaces():
        catalog.create_namespace("corpus")
    schema = pa.schema([("sample_id", pa.string()), ("lang", pa.string()), ("text", pa.string())])
    name = str(TICKETS_SOURCE["table"])
    if catalog.table_exists(name):
        catalog.drop_table(name)
    table = catalog.create_table(name, schema=schema)
    half = tickets // 2
    for lo, hi in ((0, half), (half, tickets)):
        langs = [rng.choice(LANGS) for _ in range(lo, hi)]
        table.append(
            pa.table(
                {
                    "sample_id": [f"tickets-eu/{i:07d}" for i in range(lo, hi)],
                    "lang": langs,
                    "text": [say(lang) for lang in langs],
                },
                schema=schema,
            )
        )
    return {**TICKETS_SOURCE, "catalogUri": catalog_uri, "warehouse": warehouse}


def _seed_forum(
    store: ObjectStore, rng: random.Random, objects: int, per_object: int, say: Texts
) -> int:
    """JSON-lines threads under ``raw/forum/``, one edited after upload; returns the records."""
    n = 0
    for obj in range(objects):
        lines = []
        for _ in range(per_object):
            lang = rng.choice(LANGS)
            lines.append(json.dumps({"id": f"forum/{n:07d}", "lang": lang, "text": say(lang)}))
            n += 1
        store.put(
            f"{FORUM_SOURCE['prefix']}thread-{obj:04d}.jsonl", ("\n".join(lines) + "\n").encode()
        )
    # An edit after upload: the same name now has a second version.
    edited = json.dumps({"id": f"forum/{n:07d}", "lang": "en", "text": say("en")})
    first = f"{FORUM_SOURCE['prefix']}thread-0000.jsonl"
    before = store.get(first, store.head(first).version_id).decode()
    store.put(first, (before + edited + "\n").encode())
    return n + 1


def _chat_events(rng: random.Random, count: int, say: Texts) -> list[JsonObject]:
    """Upserts, with a delete of a live transcript about one event in ten."""
    events: list[JsonObject] = []
    live: list[str] = []
    for offset in range(count):
        if live and rng.random() < DELETE_SHARE:
            victim = live.pop(rng.randrange(len(live)))
            events.append({"offset": offset, "commit": 1000 + offset, "op": "delete", "id": victim})
        else:
            sample = f"chat/{offset:07d}"
            lang = rng.choice(LANGS)
            live.append(sample)
            events.append(
                {
                    "offset": offset,
                    "commit": 1000 + offset,
                    "op": "upsert",
                    "id": sample,
                    "lang": lang,
                    "text": say(lang),
                }
            )
    return events


def seed_corpus(ws: Workspace, options: SeedOptions) -> SeededCorpus:
    """Write the three sources and configure them in the workspace (replacing earlier ones)."""
    rng = random.Random(options.seed)  # noqa: S311 - synthetic text, not a secret
    say = Texts(rng)
    tickets = _seed_tickets(ws.home, rng, options.tickets, say)
    forum_records = _seed_forum(ws.store, rng, options.forum_objects, options.per_object, say)
    events = _chat_events(rng, options.chat_events, say)
    for start in range(0, len(events), 100):
        append_segment(ws.store, str(CHAT_SOURCE["prefix"]), events[start : start + 100])
    sources: list[JsonValue] = [tickets, dict(FORUM_SOURCE), dict(CHAT_SOURCE)]
    ws.config["sources"] = sources
    records = text_records(ws, say.written)
    ws.config.setdefault("snapshot", {})["recordSchema"] = records.to_json()
    ws.save()
    return SeededCorpus(
        tickets=options.tickets,
        forum_records=forum_records,
        chat_events=options.chat_events,
        sources=[str(s["id"]) for s in DEMO_SOURCES],
    )


def seed_demo(
    ws: Workspace,
    *,
    tickets: int = 600,
    forum_objects: int = 12,
    per_object: int = 40,
    chat_events: int = 300,
    seed: int = 7,
) -> SeededCorpus:
    """The synthetic corpus in all three source kinds (keyword form of :func:`seed_corpus`)."""
    options = SeedOptions(
        tickets=tickets,
        forum_objects=forum_objects,
        per_object=per_object,
        chat_events=chat_events,
        seed=seed,
    )
    return seed_corpus(ws, options)


def text_records(ws: Workspace, texts: list[str]) -> RecordSchema:
    """The demo's text record schema, counting tokens with a BPE tokenizer trained on
    ``texts`` (the corpus just written) and registered in the workspace store."""
    digest = tokenizer.register(ws, trained_tokenizer(tuple(texts)))
    rule = TokenRule(kind="tokenizer", column="text", tokenizer=digest)
    return RecordSchema.parse({**TEXT_SCHEMA.to_json(), "tokens": rule.to_json()})


@functools.lru_cache(maxsize=4)
def trained_tokenizer(texts: tuple[str, ...]) -> bytes:
    """Training is deterministic: the same corpus gives the same tokenizer bytes."""
    return tokenizer.train(texts)


def tag_demo_transforms(ws: Workspace) -> dict[str, str]:
    """Build, register and tag the demo's pinned transform wheels; tag -> digest."""
    return {tag: spec.pin for tag, spec in register_demo_transforms(ws).items()}
