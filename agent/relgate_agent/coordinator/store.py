"""Durable coordinator state: jobs, topology versions, host inventory and held versions.

SQLite by default, PostgreSQL through a DSN; one code path (SQLAlchemy Core, plain SQL that
both dialects accept). Only small, strongly consistent state lives here; per-(host, chunk)
progress is a cache in coordinator memory rebuilt from agent reports.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, create_engine, event, text

from relgate_agent.coordinator.topology import Topology
from relgate_agent.errors import AgentError

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS dist_hosts (
        host_id TEXT PRIMARY KEY,
        rack TEXT NOT NULL,
        labels TEXT NOT NULL,
        address TEXT NOT NULL,
        last_seen BIGINT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS dist_host_versions (
        host_id TEXT NOT NULL,
        model TEXT NOT NULL,
        version TEXT NOT NULL,
        PRIMARY KEY (host_id, model, version)
    )""",
    # hosts an operator enrolled (by certificate host id); labels here are authoritative
    """CREATE TABLE IF NOT EXISTS dist_enrolled (
        host_id TEXT PRIMARY KEY,
        rack TEXT NOT NULL,
        labels TEXT NOT NULL,
        enrolled_at BIGINT NOT NULL
    )""",
    # enrollment by CSR: one-time bootstrap tokens (SHA-256 only), used_at 0 until used
    """CREATE TABLE IF NOT EXISTS dist_enroll_tokens (
        token_hash TEXT PRIMARY KEY,
        host_id TEXT NOT NULL,
        rack TEXT NOT NULL,
        expires_at BIGINT NOT NULL,
        used_at BIGINT NOT NULL
    )""",
    # revoked host certificates (hex serial), by an operator: coordinator/crl.py
    """CREATE TABLE IF NOT EXISTS dist_revoked_certs (
        serial TEXT PRIMARY KEY,
        host_id TEXT NOT NULL,
        reason TEXT NOT NULL,
        revoked_at BIGINT NOT NULL
    )""",
    # a host's CSR, and its certificate once an operator approved it (cert_pem "" till then)
    """CREATE TABLE IF NOT EXISTS dist_enroll_requests (
        host_id TEXT PRIMARY KEY,
        rack TEXT NOT NULL,
        csr_pem TEXT NOT NULL,
        token_hash TEXT NOT NULL,
        requested_at BIGINT NOT NULL,
        cert_pem TEXT NOT NULL
    )""",
    # versions the coordinator itself accepted as verified READY on a host
    """CREATE TABLE IF NOT EXISTS dist_host_verified (
        host_id TEXT NOT NULL,
        model TEXT NOT NULL,
        version TEXT NOT NULL,
        PRIMARY KEY (host_id, model, version)
    )""",
    # a finished job's figures, frozen at completion
    """CREATE TABLE IF NOT EXISTS dist_job_figures (
        job_id TEXT PRIMARY KEY,
        figures TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS dist_lease (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        expires_at_ms BIGINT NOT NULL,
        epoch BIGINT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS dist_jobs (
        job_id TEXT PRIMARY KEY,
        spec TEXT NOT NULL,
        state TEXT NOT NULL,
        manifest_digest TEXT NOT NULL,
        targets TEXT NOT NULL,
        topology_version BIGINT NOT NULL,
        topology TEXT NOT NULL,
        ready_hosts TEXT NOT NULL,
        completion_emitted INTEGER NOT NULL,
        created_at BIGINT NOT NULL,
        updated_at BIGINT NOT NULL
    )""",
    # the deployer handoff: events (DistributionComplete, HostsReady) kept until the webhook
    # answered 2xx; seq orders a job's events, delivered_at_ms = 0 while pending
    """CREATE TABLE IF NOT EXISTS dist_outbox (
        event_id TEXT PRIMARY KEY,
        job_id TEXT NOT NULL,
        seq BIGINT NOT NULL,
        kind TEXT NOT NULL,
        url TEXT NOT NULL,
        hosts TEXT NOT NULL,
        body TEXT NOT NULL,
        created_at_ms BIGINT NOT NULL,
        attempts INTEGER NOT NULL,
        next_attempt_at_ms BIGINT NOT NULL,
        delivered_at_ms BIGINT NOT NULL,
        last_error TEXT NOT NULL
    )""",
    # hosts quarantined in a job (BAD_DATA from distinct downstreams): excluded for good
    """CREATE TABLE IF NOT EXISTS dist_quarantine (
        job_id TEXT NOT NULL,
        host_id TEXT NOT NULL,
        reporters TEXT NOT NULL,
        quarantined_at BIGINT NOT NULL,
        PRIMARY KEY (job_id, host_id)
    )""",
    # slowness evidence a new leader resumes (coordinator/slowclock.py): per (job, host)
    # since when it has been slow (wall ms, 0: not now), whether it was demoted, and the
    # upstreams it was a slow first hop with; per job the held reference rates
    """CREATE TABLE IF NOT EXISTS dist_slowness (
        job_id TEXT NOT NULL,
        host_id TEXT NOT NULL,
        slow_since_ms BIGINT NOT NULL,
        demoted INTEGER NOT NULL,
        slow_with TEXT NOT NULL,
        PRIMARY KEY (job_id, host_id)
    )""",
    """CREATE TABLE IF NOT EXISTS dist_rate_reference (
        job_id TEXT PRIMARY KEY,
        stripe_bps BIGINT NOT NULL,
        total_bps BIGINT NOT NULL,
        at_ms BIGINT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS dist_outbox_pending ON dist_outbox (delivered_at_ms, job_id, seq)",
    # the manifest digest a verified READY was accepted for (a host "already holds" a job's
    # checkpoint only under the same digest, never by model/version alone)
    """CREATE TABLE IF NOT EXISTS dist_host_digest (
        host_id TEXT NOT NULL,
        model TEXT NOT NULL,
        version TEXT NOT NULL,
        digest TEXT NOT NULL,
        PRIMARY KEY (host_id, model, version)
    )""",
    # each host's signed placement attestation (relgate_agent/attestation.py) per manifest
    # digest it placed, sent with its READY; deployer events carry them
    """CREATE TABLE IF NOT EXISTS dist_placements (
        host_id TEXT NOT NULL,
        digest TEXT NOT NULL,
        attestation TEXT NOT NULL,
        PRIMARY KEY (host_id, digest)
    )""",
]
# the second migration step: the ledger's tables (coordinator/ledger.py reads and writes them)
LEDGER_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS dist_host_bytes (
        job_id TEXT NOT NULL,
        host_id TEXT NOT NULL,
        rx BIGINT NOT NULL,
        tx BIGINT NOT NULL,
        origin BIGINT NOT NULL,
        PRIMARY KEY (job_id, host_id)
    )""",
    """CREATE TABLE IF NOT EXISTS dist_removed (
        job_id TEXT NOT NULL,
        host_id TEXT NOT NULL,
        reason TEXT NOT NULL,
        removed_at BIGINT NOT NULL,
        PRIMARY KEY (job_id, host_id)
    )""",
    """CREATE TABLE IF NOT EXISTS dist_host_holds (
        host_id TEXT PRIMARY KEY,
        kind TEXT NOT NULL,
        reason TEXT NOT NULL,
        job_id TEXT NOT NULL,
        since BIGINT NOT NULL
    )""",
]
OUTBOX_BATCH = 1000  # pending events one delivery pass looks at (bounded)
_ERROR_TEXT_MAX = 500


class StaleTopology(AgentError):
    """A topology write named a version that is no longer the latest (monotonicity guard)."""


class Fenced(StaleTopology):
    """A job write by a replica that no longer holds the job's lease at the epoch it loaded
    the job under (sharded coordinators: a deposed or frozen replica writes nothing).
    The server answers it as it answers NotLeader (UNAVAILABLE): the client moves on."""

    check = "job-lease-fence"


JOB_LEASE_PREFIX = "job:"


def job_lease_name(job_id: str) -> str:
    """The lease row of ``job_id`` (one rule: the store's fence and the shard use it)."""
    return JOB_LEASE_PREFIX + job_id


@dataclass
class LeaseFence:
    """Who may write jobs: ``holder`` only, and a job only at the epoch of its lease it holds."""

    holder: str
    epochs: dict[str, int]  # job -> the epoch of its lease ``holder`` loaded it under

    def clause(self, job_id: str, params: dict[str, Any]) -> str:
        """The WHERE condition a fenced job write adds (its parameters into ``params``)."""
        params |= {
            "fence_n": job_lease_name(job_id),
            "fence_h": self.holder,
            "fence_e": self.epochs.get(job_id, -1),
        }
        return (
            " AND EXISTS (SELECT 1 FROM dist_lease WHERE name = :fence_n "
            "AND holder = :fence_h AND epoch = :fence_e)"
        )


@dataclass
class JobRow:
    job_id: str
    spec: dict[str, Any]
    state: str
    manifest_digest: str
    targets: dict[str, str]  # host -> rack
    topology: Topology
    ready_hosts: list[str]
    completion_emitted: bool
    created_at: int


@dataclass(frozen=True)
class OutboxRow:
    """One deployer event as the outbox holds it (``body`` is the JSON as sent)."""

    event_id: str
    job_id: str
    kind: str
    url: str
    hosts: tuple[str, ...]
    body: bytes
    attempts: int = 0
    next_attempt_at_ms: int = 0
    delivered_at_ms: int = 0
    last_error: str = ""


@dataclass(frozen=True)
class SlowRecord:
    """One host's slowness evidence in a job, as the store holds it."""

    slow_since_ms: int  # wall clock, ms; 0: not slow now (a demoted leaf)
    demoted: bool
    slow_with: frozenset[str]


@dataclass(frozen=True)
class RateReference:
    """A job's held (per-stripe, total) reference rates and when they were held."""

    stripe_bps: int
    total_bps: int
    at_ms: int  # wall clock


_OUTBOX_COLUMNS = (
    "event_id, job_id, kind, url, hosts, body, attempts, next_attempt_at_ms, delivered_at_ms, "
    "last_error"
)


def _outbox_row(r: Any) -> OutboxRow:
    hosts = json.loads(r[4])
    return OutboxRow(
        str(r[0]),
        str(r[1]),
        str(r[2]),
        str(r[3]),
        tuple(str(h) for h in hosts) if isinstance(hosts, list) else (),
        str(r[5]).encode(),
        int(r[6]),
        int(r[7]),
        int(r[8]),
        str(r[9]),
    )


def _dsn(dsn_or_path: str) -> str:
    if "://" in dsn_or_path:
        if dsn_or_path.startswith("postgresql://"):
            return "postgresql+psycopg://" + dsn_or_path[len("postgresql://") :]
        return dsn_or_path
    return f"sqlite:///{dsn_or_path}"


class JobStore:
    def __init__(self, dsn_or_path: str) -> None:
        url = _dsn(dsn_or_path)
        self.is_sqlite = url.startswith("sqlite")
        self.engine = create_engine(url, future=True, pool_pre_ping=True)
        self.fence: LeaseFence | None = None  # set by a sharded replica (coordinator/shard.py)
        if self.is_sqlite:

            @event.listens_for(self.engine, "connect")
            def _pragmas(dbapi_conn: Any, _rec: Any) -> None:
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=FULL")
                cur.execute("PRAGMA busy_timeout=5000")
                cur.close()

        with self.tx() as c:
            for stmt in SCHEMA:
                c.execute(text(stmt))
        with self.tx() as c:  # second step: host byte counters, removed targets, host holds
            for stmt in LEDGER_SCHEMA:
                c.execute(text(stmt))

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def tx(self) -> Iterator[Connection]:
        with self.engine.begin() as conn:
            yield conn

    def _execute(self, sql: str, params: dict[str, Any]) -> None:
        """One statement in its own transaction."""
        with self.tx() as c:
            c.execute(text(sql), params)

    # -- leader lease ---------------------------------------------------------
    def acquire_lease(self, holder: str, ttl_s: float, name: str = "coordinator") -> int | None:
        """Take or renew the leader lease; returns the epoch when ``holder`` leads, else None.

        The epoch increases on every change of holder, so a deposed leader can tell.
        """
        now = int(time.time() * 1000)
        exp = now + int(ttl_s * 1000)
        with self.tx() as c:
            c.execute(
                text(
                    "INSERT INTO dist_lease (name, holder, expires_at_ms, epoch) VALUES (:n, :h, :e, 1) "
                    "ON CONFLICT (name) DO NOTHING"
                ),
                {"n": name, "h": holder, "e": exp},
            )
            res = c.execute(
                text(
                    "UPDATE dist_lease SET epoch = CASE WHEN holder = :h THEN epoch ELSE epoch + 1 END, "
                    "holder = :h, expires_at_ms = :e "
                    "WHERE name = :n AND (holder = :h OR expires_at_ms < :now)"
                ),
                {"n": name, "h": holder, "e": exp, "now": now},
            )
            if res.rowcount != 1:
                return None
            row = c.execute(
                text("SELECT epoch FROM dist_lease WHERE name = :n"), {"n": name}
            ).first()
        return int(row[0]) if row else None

    def release_lease(self, holder: str, name: str = "coordinator") -> None:
        with self.tx() as c:
            c.execute(
                text("UPDATE dist_lease SET expires_at_ms = 0 WHERE name = :n AND holder = :h"),
                {"n": name, "h": holder},
            )

    # -- hosts --------------------------------------------------------------
    def touch_hosts(self, seen: dict[str, int]) -> None:
        """Refresh ``last_seen`` (host -> wall seconds) of inventory rows, one transaction."""
        with self.tx() as c:
            c.execute(
                text("UPDATE dist_hosts SET last_seen = :t WHERE host_id = :h AND last_seen < :t"),
                [{"h": h, "t": t} for h, t in seen.items()],
            )

    def upsert_host(
        self, host_id: str, rack: str, labels: dict[str, str], address: str, held: list[str]
    ) -> None:
        now = int(time.time())
        with self.tx() as c:
            c.execute(
                text(
                    "INSERT INTO dist_hosts (host_id, rack, labels, address, last_seen) "
                    "VALUES (:h, :r, :l, :a, :t) ON CONFLICT (host_id) DO UPDATE SET "
                    "rack = excluded.rack, labels = excluded.labels, address = excluded.address, "
                    "last_seen = excluded.last_seen"
                ),
                {
                    "h": host_id,
                    "r": rack,
                    "l": json.dumps(labels, sort_keys=True),
                    "a": address,
                    "t": now,
                },
            )
            c.execute(text("DELETE FROM dist_host_versions WHERE host_id = :h"), {"h": host_id})
            for mv in held:
                model, _, version = mv.partition("/")
                if model and version:
                    c.execute(
                        text(
                            "INSERT INTO dist_host_versions (host_id, model, version) VALUES (:h, :m, :v)"
                        ),
                        {"h": host_id, "m": model, "v": version},
                    )

    def hosts(self) -> list[tuple[str, str, dict[str, str], str]]:
        with self.tx() as c:
            rows = c.execute(
                text("SELECT host_id, rack, labels, address FROM dist_hosts ORDER BY host_id")
            ).all()
        return [(r[0], r[1], json.loads(r[2]), r[3]) for r in rows]

    def hosts_holding(self, model: str, version: str, digest: str) -> set[str]:
        """Hosts that still say they hold the version AND that this coordinator once accepted
        a verified READY from for it under manifest ``digest`` (a claim alone never counts,
        nor a READY for another manifest of the same model/version)."""
        with self.tx() as c:
            rows = c.execute(
                text(
                    "SELECT v.host_id FROM dist_host_versions v JOIN dist_host_verified w "
                    "ON v.host_id = w.host_id AND v.model = w.model AND v.version = w.version "
                    "JOIN dist_host_digest d "
                    "ON v.host_id = d.host_id AND v.model = d.model AND v.version = d.version "
                    "WHERE v.model = :m AND v.version = :v AND d.digest = :d"
                ),
                {"m": model, "v": version, "d": digest},
            ).all()
        return {r[0] for r in rows}

    def mark_host_version(self, host_id: str, model: str, version: str, digest: str) -> None:
        with self.tx() as c:
            for table in ("dist_host_versions", "dist_host_verified"):
                c.execute(
                    text(
                        f"INSERT INTO {table} (host_id, model, version) VALUES (:h, :m, :v) "  # noqa: S608 - constant table names
                        "ON CONFLICT (host_id, model, version) DO NOTHING"
                    ),
                    {"h": host_id, "m": model, "v": version},
                )
            c.execute(
                text(
                    "INSERT INTO dist_host_digest (host_id, model, version, digest) "
                    "VALUES (:h, :m, :v, :d) ON CONFLICT (host_id, model, version) "
                    "DO UPDATE SET digest = excluded.digest"
                ),
                {"h": host_id, "m": model, "v": version, "d": digest},
            )

    def forget_host_version(self, host_id: str, model: str, version: str) -> None:
        """The coordinator no longer vouches for the host's copy (it was quarantined)."""
        with self.tx() as c:
            for table in ("dist_host_verified", "dist_host_digest"):
                c.execute(
                    text(
                        f"DELETE FROM {table} WHERE host_id = :h AND model = :m AND version = :v"  # noqa: S608 - constant table names
                    ),
                    {"h": host_id, "m": model, "v": version},
                )

    # -- placement attestations ---------------------------------------------
    def put_attestation(self, host_id: str, digest: str, attestation: str) -> None:
        self._execute(
            "INSERT INTO dist_placements (host_id, digest, attestation) VALUES (:h, :d, :a) "
            "ON CONFLICT (host_id, digest) DO UPDATE SET attestation = excluded.attestation",
            {"h": host_id, "d": digest, "a": attestation},
        )

    def attestations(self, digest: str, hosts: list[str]) -> dict[str, str]:
        """Host -> its signed placement attestation (JSON text) of ``digest``, for those of
        ``hosts`` that sent one."""
        wanted = set(hosts)
        with self.tx() as c:
            rows = c.execute(
                text("SELECT host_id, attestation FROM dist_placements WHERE digest = :d"),
                {"d": digest},
            ).all()
        return {str(r[0]): str(r[1]) for r in rows if str(r[0]) in wanted}

    # -- quarantine ---------------------------------------------------------
    def quarantine_host(self, job_id: str, host_id: str, reporters: list[str], at: int) -> None:
        """``at``: when (wall time, Unix seconds)."""
        self._execute(
            "INSERT INTO dist_quarantine (job_id, host_id, reporters, quarantined_at) "
            "VALUES (:j, :h, :r, :t) ON CONFLICT (job_id, host_id) DO NOTHING",
            {"j": job_id, "h": host_id, "r": json.dumps(sorted(reporters)), "t": at},
        )

    def quarantined(self, job_id: str) -> dict[str, int]:
        """The job's quarantined hosts -> when (Unix seconds)."""
        with self.tx() as c:
            rows = c.execute(
                text("SELECT host_id, quarantined_at FROM dist_quarantine WHERE job_id = :j"),
                {"j": job_id},
            ).all()
        return {str(r[0]): int(r[1]) for r in rows}

    # -- slowness evidence --------------------------------------------------
    def put_slowness(self, job_id: str, host_id: str, rec: SlowRecord) -> None:
        self._execute(
            "INSERT INTO dist_slowness (job_id, host_id, slow_since_ms, demoted, slow_with) "
            "VALUES (:j, :h, :s, :d, :w) ON CONFLICT (job_id, host_id) DO UPDATE SET "
            "slow_since_ms = excluded.slow_since_ms, demoted = excluded.demoted, "
            "slow_with = excluded.slow_with",
            {
                "j": job_id,
                "h": host_id,
                "s": rec.slow_since_ms,
                "d": int(rec.demoted),
                "w": json.dumps(sorted(rec.slow_with)),
            },
        )

    def drop_slowness(self, job_id: str, host_id: str) -> None:
        self._execute(
            "DELETE FROM dist_slowness WHERE job_id = :j AND host_id = :h",
            {"j": job_id, "h": host_id},
        )

    def slowness(self, job_id: str) -> dict[str, SlowRecord]:
        with self.tx() as c:
            rows = c.execute(
                text(
                    "SELECT host_id, slow_since_ms, demoted, slow_with FROM dist_slowness "
                    "WHERE job_id = :j"
                ),
                {"j": job_id},
            ).all()
        return {
            str(r[0]): SlowRecord(int(r[1]), bool(r[2]), frozenset(map(str, json.loads(r[3]))))
            for r in rows
        }

    def put_rate_reference(self, job_id: str, ref: RateReference) -> None:
        self._execute(
            "INSERT INTO dist_rate_reference (job_id, stripe_bps, total_bps, at_ms) "
            "VALUES (:j, :s, :t, :a) ON CONFLICT (job_id) DO UPDATE SET "
            "stripe_bps = excluded.stripe_bps, total_bps = excluded.total_bps, "
            "at_ms = excluded.at_ms",
            {"j": job_id, "s": ref.stripe_bps, "t": ref.total_bps, "a": ref.at_ms},
        )

    def rate_reference(self, job_id: str) -> RateReference | None:
        with self.tx() as c:
            row = c.execute(
                text(
                    "SELECT stripe_bps, total_bps, at_ms FROM dist_rate_reference WHERE job_id = :j"
                ),
                {"j": job_id},
            ).first()
        return RateReference(int(row[0]), int(row[1]), int(row[2])) if row else None

    # -- enrollment ---------------------------------------------------------
    def enroll(self, host_id: str, rack: str, labels: dict[str, str]) -> None:
        with self.tx() as c:
            c.execute(
                text(
                    "INSERT INTO dist_enrolled (host_id, rack, labels, enrolled_at) "
                    "VALUES (:h, :r, :l, :t) ON CONFLICT (host_id) DO UPDATE SET "
                    "rack = excluded.rack, labels = excluded.labels"
                ),
                {
                    "h": host_id,
                    "r": rack,
                    "l": json.dumps(labels, sort_keys=True),
                    "t": int(time.time()),
                },
            )

    def unenroll(self, host_id: str) -> None:
        with self.tx() as c:
            c.execute(text("DELETE FROM dist_enrolled WHERE host_id = :h"), {"h": host_id})
            c.execute(text("DELETE FROM dist_hosts WHERE host_id = :h"), {"h": host_id})

    def enrolled(self) -> dict[str, tuple[str, dict[str, str]]]:
        with self.tx() as c:
            rows = c.execute(text("SELECT host_id, rack, labels FROM dist_enrolled")).all()
        return {r[0]: (r[1], json.loads(r[2])) for r in rows}

    def enrollment(self, host_id: str) -> tuple[str, dict[str, str]] | None:
        """One host's enrolled rack and labels (a heartbeat reads one row, not the fleet)."""
        with self.tx() as c:
            row = c.execute(
                text("SELECT rack, labels FROM dist_enrolled WHERE host_id = :h"), {"h": host_id}
            ).first()
        return None if row is None else (row[0], json.loads(row[1]))

    # -- certificate revocation ----------------------------------------------
    def revoke_cert(self, serial: str, host_id: str, reason: str) -> bool:
        """Add ``serial`` (hex) to the revocation list; False when it was there already."""
        with self.tx() as c:
            res = c.execute(
                text(
                    "INSERT INTO dist_revoked_certs (serial, host_id, reason, revoked_at) "
                    "VALUES (:s, :h, :r, :t) ON CONFLICT (serial) DO NOTHING"
                ),
                {"s": serial, "h": host_id, "r": reason, "t": int(time.time())},
            )
        return bool(res.rowcount)

    def revoked_certs(self) -> list[tuple[str, str, str, int]]:
        """(serial, host_id, reason, revoked_at) of every revoked certificate, by serial."""
        with self.tx() as c:
            rows = c.execute(
                text(
                    "SELECT serial, host_id, reason, revoked_at FROM dist_revoked_certs "
                    "ORDER BY serial"
                )
            ).all()
        return [(r[0], r[1], r[2], int(r[3])) for r in rows]

    # -- enrollment by CSR ----------------------------------------------------
    def add_enroll_token(self, digest: str, host_id: str, rack: str, expires_at: int) -> None:
        with self.tx() as c:
            c.execute(
                text(
                    "INSERT INTO dist_enroll_tokens (token_hash, host_id, rack, expires_at, "
                    "used_at) VALUES (:d, :h, :r, :e, 0)"
                ),
                {"d": digest, "h": host_id, "r": rack, "e": expires_at},
            )

    def enroll_token(self, digest: str) -> tuple[str, str, int, int] | None:
        """(host id, rack, expires at, used at) of a token by its SHA-256."""
        with self.tx() as c:
            row = c.execute(
                text(
                    "SELECT host_id, rack, expires_at, used_at FROM dist_enroll_tokens "
                    "WHERE token_hash = :d"
                ),
                {"d": digest},
            ).first()
        return None if row is None else (row[0], row[1], int(row[2]), int(row[3]))

    def use_enroll_token(
        self, digest: str, host_id: str, rack: str, csr_pem: str, now: int
    ) -> bool:
        """Mark the token used and record the host's CSR, in one transaction; False when
        another request used the token first."""
        with self.tx() as c:
            used = c.execute(
                text(
                    "UPDATE dist_enroll_tokens SET used_at = :n "
                    "WHERE token_hash = :d AND used_at = 0"
                ),
                {"d": digest, "n": now},
            ).rowcount
            if used != 1:
                return False
            c.execute(text("DELETE FROM dist_enroll_requests WHERE host_id = :h"), {"h": host_id})
            c.execute(
                text(
                    "INSERT INTO dist_enroll_requests (host_id, rack, csr_pem, token_hash, "
                    "requested_at, cert_pem) VALUES (:h, :r, :c, :d, :n, '')"
                ),
                {"h": host_id, "r": rack, "c": csr_pem, "d": digest, "n": now},
            )
        return True

    def enroll_requests(self) -> list[tuple[str, str, str, str, int, str]]:
        """(host id, rack, CSR, token hash, requested at, certificate) of every request."""
        with self.tx() as c:
            rows = c.execute(
                text(
                    "SELECT host_id, rack, csr_pem, token_hash, requested_at, cert_pem "
                    "FROM dist_enroll_requests ORDER BY requested_at, host_id"
                )
            ).all()
        return [(r[0], r[1], r[2], r[3], int(r[4]), r[5]) for r in rows]

    def set_enroll_cert(self, host_id: str, cert_pem: str) -> bool:
        with self.tx() as c:
            n = c.execute(
                text(
                    "UPDATE dist_enroll_requests SET cert_pem = :p "
                    "WHERE host_id = :h AND cert_pem = ''"
                ),
                {"h": host_id, "p": cert_pem},
            ).rowcount
        return n == 1

    def last_seen(self) -> dict[str, float]:
        """Wall-clock time of each host's last heartbeat (the opening of its watch)."""
        with self.tx() as c:
            rows = c.execute(text("SELECT host_id, last_seen FROM dist_hosts")).all()
        return {r[0]: float(r[1]) for r in rows}

    # -- figures ------------------------------------------------------------
    def save_figures(self, job_id: str, figures: dict[str, Any]) -> None:
        body = json.dumps(figures, sort_keys=True)
        with self.tx() as c:
            c.execute(
                text(
                    "INSERT INTO dist_job_figures (job_id, figures) VALUES (:j, :f) "
                    "ON CONFLICT (job_id) DO UPDATE SET figures = excluded.figures"
                ),
                {"j": job_id, "f": body},
            )

    def figures(self, job_id: str) -> dict[str, Any] | None:
        with self.tx() as c:
            row = c.execute(
                text("SELECT figures FROM dist_job_figures WHERE job_id = :j"), {"j": job_id}
            ).first()
        return json.loads(row[0]) if row else None

    # -- jobs ---------------------------------------------------------------
    def create_job(self, row: JobRow) -> bool:
        """Insert a job; False if the id exists (idempotent create)."""
        now = int(time.time())
        with self.tx() as c:
            exists = c.execute(
                text("SELECT 1 FROM dist_jobs WHERE job_id = :j"), {"j": row.job_id}
            ).first()
            if exists:
                return False
            c.execute(
                text(
                    "INSERT INTO dist_jobs (job_id, spec, state, manifest_digest, targets, topology_version, "
                    "topology, ready_hosts, completion_emitted, created_at, updated_at) VALUES "
                    "(:j, :s, :st, :d, :tg, :tv, :t, :r, :ce, :now, :now)"
                ),
                {
                    "j": row.job_id,
                    "s": json.dumps(row.spec, sort_keys=True),
                    "st": row.state,
                    "d": row.manifest_digest,
                    "tg": json.dumps(row.targets, sort_keys=True),
                    "tv": row.topology.version,
                    "t": json.dumps(row.topology.to_json(), sort_keys=True),
                    "r": json.dumps(sorted(row.ready_hosts)),
                    "ce": int(row.completion_emitted),
                    "now": now,
                },
            )
        return True

    def save_topology(
        self, job_id: str, expected_version: int, topo: Topology, targets: dict[str, str]
    ) -> None:
        """Compare-and-set on topology_version: a stale writer (old leader) loses."""
        if topo.version <= expected_version:
            raise StaleTopology(
                f"job {job_id}: topology version {topo.version} is not above {expected_version}"
            )
        params: dict[str, Any] = {
            "v": topo.version,
            "t": json.dumps(topo.to_json(), sort_keys=True),
            "tg": json.dumps(targets, sort_keys=True),
            "now": int(time.time()),
            "j": job_id,
            "old": expected_version,
        }
        sql = (
            "UPDATE dist_jobs SET topology_version = :v, topology = :t, targets = :tg, "
            "updated_at = :now WHERE job_id = :j AND topology_version = :old"
        )
        if self.fence:  # a constant clause; its values are bound parameters
            sql += self.fence.clause(job_id, params)
        with self.tx() as c:
            res = c.execute(text(sql), params)
            if res.rowcount != 1:
                self._refuse_fenced(c, job_id)
                raise StaleTopology(f"job {job_id}: topology version moved past {expected_version}")

    def _refuse_fenced(self, c: Connection, job_id: str) -> None:
        """Raise :class:`Fenced` when a job write matched no row for want of its lease."""
        if self.fence is None:
            return
        params: dict[str, Any] = {"j": job_id}
        sql = "SELECT 1 FROM dist_jobs WHERE job_id = :j" + self.fence.clause(job_id, params)  # noqa: S608 - a constant clause, bound values
        held = c.execute(text(sql), params).first()
        if held is None:
            raise Fenced(
                f"job {job_id}: replica {self.fence.holder} no longer holds its lease "
                f"at epoch {self.fence.epochs.get(job_id, -1)}"
            )

    def update_job(
        self,
        job_id: str,
        *,
        state: str | None = None,
        ready_hosts: list[str] | None = None,
        completion_emitted: bool | None = None,
    ) -> None:
        sets = ["updated_at = :now"]
        params: dict[str, Any] = {"j": job_id, "now": int(time.time())}
        if state is not None:
            sets.append("state = :st")
            params["st"] = state
        if ready_hosts is not None:
            sets.append("ready_hosts = :r")
            params["r"] = json.dumps(sorted(ready_hosts))
        if completion_emitted is not None:
            sets.append("completion_emitted = :ce")
            params["ce"] = int(completion_emitted)
        fenced = self.fence.clause(job_id, params) if self.fence else ""
        with self.tx() as c:
            # the SET list is built from constant column names; values are bound parameters
            res = c.execute(
                text(f"UPDATE dist_jobs SET {', '.join(sets)} WHERE job_id = :j{fenced}"),  # noqa: S608
                params,
            )
            if res.rowcount != 1:
                self._refuse_fenced(c, job_id)

    def job_state(self, job_id: str) -> str | None:
        with self.tx() as c:
            row = c.execute(
                text("SELECT state FROM dist_jobs WHERE job_id = :j"), {"j": job_id}
            ).first()
        return str(row[0]) if row else None

    def load_jobs(self, states: tuple[str, ...] | None = None) -> list[JobRow]:
        with self.tx() as c:
            rows = c.execute(
                text(
                    "SELECT job_id, spec, state, manifest_digest, targets, topology, ready_hosts, "
                    "completion_emitted, created_at FROM dist_jobs ORDER BY created_at, job_id"
                )
            ).all()
        out = []
        for r in rows:
            if states is not None and r[2] not in states:
                continue
            out.append(
                JobRow(
                    r[0],
                    json.loads(r[1]),
                    r[2],
                    r[3],
                    json.loads(r[4]),
                    Topology.from_json(json.loads(r[5])),
                    json.loads(r[6]),
                    bool(r[7]),
                    int(r[8]),
                )
            )
        return out

    # -- outbox (deployer events) -------------------------------------------
    def enqueue_event(self, row: OutboxRow, now_ms: int) -> bool:
        """Add an event after the job's others; False if its id is already there (idempotent:
        the same event enqueued twice, e.g. by a new leader, is one event)."""
        with self.tx() as c:
            res = c.execute(
                text(
                    f"INSERT INTO dist_outbox ({_OUTBOX_COLUMNS}, seq, created_at_ms) "  # noqa: S608 - constant column list
                    "SELECT :id, :j, :k, :u, :h, :b, 0, :now, :d, '', "
                    "COALESCE(MAX(seq), 0) + 1, :now FROM dist_outbox WHERE job_id = :j "
                    "ON CONFLICT (event_id) DO NOTHING"
                ),
                {
                    "id": row.event_id,
                    "j": row.job_id,
                    "k": row.kind,
                    "u": row.url,
                    "h": json.dumps(list(row.hosts)),
                    "b": row.body.decode(),
                    "now": now_ms,
                    "d": row.delivered_at_ms,
                },
            )
        return bool(res.rowcount == 1)

    def pending_events(self, limit: int = OUTBOX_BATCH) -> list[OutboxRow]:
        """Undelivered events, each job's in order (at most ``limit``)."""
        with self.tx() as c:
            rows = c.execute(
                text(
                    f"SELECT {_OUTBOX_COLUMNS} FROM dist_outbox WHERE delivered_at_ms = 0 "  # noqa: S608 - constant column list
                    "ORDER BY job_id, seq LIMIT :n"
                ),
                {"n": max(1, limit)},
            ).all()
        return [_outbox_row(r) for r in rows]

    def job_events(self, job_id: str) -> list[OutboxRow]:
        with self.tx() as c:
            rows = c.execute(
                text(
                    f"SELECT {_OUTBOX_COLUMNS} FROM dist_outbox WHERE job_id = :j ORDER BY seq"  # noqa: S608 - constant column list
                ),
                {"j": job_id},
            ).all()
        return [_outbox_row(r) for r in rows]

    def count_pending_events(self, job_id: str) -> int:
        with self.tx() as c:
            row = c.execute(
                text("SELECT COUNT(*) FROM dist_outbox WHERE job_id = :j AND delivered_at_ms = 0"),
                {"j": job_id},
            ).first()
        return int(row[0]) if row else 0

    def mark_event_delivered(self, event_id: str, now_ms: int) -> None:
        self._execute(
            "UPDATE dist_outbox SET delivered_at_ms = :now, attempts = attempts + 1 "
            "WHERE event_id = :id AND delivered_at_ms = 0",
            {"id": event_id, "now": max(now_ms, 1)},
        )

    def mark_event_failed(self, event_id: str, next_attempt_at_ms: int, error: str) -> None:
        self._execute(
            "UPDATE dist_outbox SET attempts = attempts + 1, next_attempt_at_ms = :next, "
            "last_error = :e WHERE event_id = :id AND delivered_at_ms = 0",
            {"id": event_id, "next": next_attempt_at_ms, "e": error[:_ERROR_TEXT_MAX]},
        )
