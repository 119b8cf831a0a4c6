"""One distribution job on one host: stripe workers, verification, journal, placement.

Per stripe a worker pulls blocks from its assigned upstream (a peer's StreamStripe, or the
origin for stripe roots), checks each block's CRC32C against the signed manifest *before*
making it available to its own downstreams (cut-through forwarding happens by downstreams
pulling from this host's data-plane server as soon as a block is available), writes it
with pwrite at its manifest offset, and hashes each completed chunk (read back from disk)
against the manifest before counting it. Verified chunks go into a journal that is fsynced
every few seconds after the staging files are fsynced; a restarted agent resumes from it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from relgate_agent.errors import (
    KIND_CHUNK_FAILED,
    KIND_HOST_FAILED,
    AgentError,
    ManifestError,
    OriginError,
    StorageError,
)
from relgate_agent.fstree import UnsafePathError
from relgate_agent.manifest import CheckpointManifest, TrustedKeys, crc32c, verify_envelope
from relgate_agent.origin import ManifestReader, TokenBucket, object_uri, open_origin
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.storage import (
    JournalState,
    StagedMismatch,
    VersionStore,
    bitmap_from_bits,
    bits_from_bitmap,
    fault_hook,
    gc_versions,
    scrub_placed,
)
from relgate_agent.transport import DEFAULT_CREDITS, StripeStream, TransportError, fetch_chunk

if TYPE_CHECKING:
    from relgate_agent.agent.host import HostAgent

log = logging.getLogger(__name__)

ORIGIN = "ORIGIN"
# Test-only fault hooks (FAULT_ENV, read by the *receiving* agent): "corrupt_disk_chunk=<c>"
# flips a byte of chunk c on disk right after its last block is written (once), like a bad
# disk would; "pause_before_place=<gate>[:<times>]" stops before each of the first <times>
# placements, writes <gate>.waiting (the staging tree) and waits until <gate> exists (the
# test changes staging meanwhile), so a flip between verification and rename is real.
CHUNK_FAILED = KIND_CHUNK_FAILED
HOST_FAILED = KIND_HOST_FAILED


class CrcMismatch(AgentError):
    def __init__(self, block: int, source: str) -> None:
        super().__init__(f"block {block} from {source} failed CRC32C")
        self.block = block
        self.source = source


@dataclass
class AgentConfig:
    host_id: str
    rack: str
    coordinator: str
    models_root: Path
    trusted_keys: TrustedKeys
    labels: dict[str, str] = field(default_factory=dict)
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    advertise_host: str = ""
    journal_interval_s: float = 2.0
    report_interval_s: float = 1.0
    long_poll_s: float = 10.0
    credits: int = DEFAULT_CREDITS
    stall_s: float = 5.0
    retain_versions: int = 2  # current + N-1
    max_rate_bytes_per_s: int = 0  # per-host cap on data-plane rx and tx (0 = NIC speed)
    # a chunk that fails verification this many times from the origin (or from each of two
    # or more peers) fails the job, naming the chunk, file and origin object; a peer that
    # fails it this many times is bypassed (FetchChunk from another holder)
    max_chunk_failures: int = 3
    # placement re-verifies the staged tree; after this many mismatching rounds (each one
    # re-fetching the bad chunks) the host gives up on the job, never placing
    placement_attempts: int = 3
    repair_attempts: int = 60  # FetchChunk rounds (0.25 s apart) before the stripe re-pulls


class ChunkTracker:
    """Which blocks are on disk (servable) and which chunks verified; wakes waiting servers."""

    def __init__(self, manifest: CheckpointManifest) -> None:
        self.m = manifest
        self.verified = bytearray(manifest.num_chunks)
        self.available = bytearray(manifest.num_blocks)
        self.cond = threading.Condition()
        self.n_verified = 0

    def mark_available(self, block: int) -> None:
        with self.cond:
            self.available[block] = 1
            self.cond.notify_all()

    def mark_verified(self, chunk: int) -> None:
        with self.cond:
            if not self.verified[chunk]:
                self.verified[chunk] = 1
                self.n_verified += 1
            for b in self.m.chunk_blocks(chunk):
                self.available[b] = 1
            self.cond.notify_all()

    def unmark_chunk(self, chunk: int) -> None:
        with self.cond:
            if self.verified[chunk]:
                self.verified[chunk] = 0
                self.n_verified -= 1
            for b in self.m.chunk_blocks(chunk):
                self.available[b] = 0
            self.cond.notify_all()

    def wait_block(self, block: int, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.available[block] == 1, timeout)

    def chunk_complete_on_disk(self, chunk: int) -> bool:
        return all(self.available[b] for b in self.m.chunk_blocks(chunk))

    def all_verified(self) -> bool:
        return self.n_verified == self.m.num_chunks

    def bitmap(self) -> bytes:
        with self.cond:
            return bitmap_from_bits(self.verified)


class JobRunner:
    """Runs one job on this host and serves its blocks to downstream peers."""

    def __init__(self, agent: HostAgent, job_id: str, model: str, version: str) -> None:
        self.agent = agent
        self.cfg = agent.config
        self.job_id = job_id
        self.model = model
        self.version = version
        self.stop_event = threading.Event()
        self.ready = False
        self.manifest: CheckpointManifest | None = None
        self.store: VersionStore | None = None
        self.tracker: ChunkTracker | None = None
        self.origin_uri = ""
        self.reader: ManifestReader | None = None
        self.stripes = 0
        self._stripe_blocks: list[list[int]] = []
        self.topology_version = 0
        self.assignment: dict[int, pb.StripeAssignment] = {}
        self.members: set[str] = set()  # hosts of the current topology (may FetchChunk from us)
        self.assign_cond = threading.Condition()
        self.errors: deque[pb.ReportError] = deque(maxlen=200)
        self.buckets: dict[int, TokenBucket] = {}
        self.journal_dirty = threading.Event()
        self.threads: list[threading.Thread] = []
        self.cancelled = False
        self.fault_disk_chunk = int(fault_hook("corrupt_disk_chunk") or -1)
        gate, _, times = (fault_hook("pause_before_place") or "").partition(":")
        self.fault_pause_gate = gate
        self.fault_pauses = int(times or 1) if gate else 0
        self.envelope = b""  # the signed manifest, kept beside the placed marker
        self.chunk_failures: dict[int, dict[str, int]] = {}
        self.placement_rounds = 0
        self.failed = ""  # why this host gave up (CHUNK_FAILED / HOST_FAILED detail)
        # counters for this process
        self.lock = threading.Lock()
        self.rx_bytes = 0
        self.tx_bytes = 0
        self.origin_bytes = 0
        self.crc_errors = 0
        self.hash_mismatches = 0
        self.refetched_chunks = 0
        self.resumed_chunks = 0
        self.staged_mismatches = 0
        self.repairing: set[int] = set()  # chunks being re-fetched by FetchChunk
        self.swarm_chunks = 0  # chunks pulled peer-to-peer while a chain was broken
        self._rate_mark = (time.monotonic(), 0, 0)
        self.rx_bps = 0
        self.tx_bps = 0

    # ------------------------------------------------------------------ BlockSource
    @property
    def closed(self) -> bool:
        return self.stop_event.is_set()

    def stripe_blocks(self, stripe: int) -> list[int]:
        if not 0 <= stripe < len(self._stripe_blocks):
            return []
        return self._stripe_blocks[stripe]

    def wait_block(self, block: int, timeout: float) -> bool:
        assert self.tracker is not None
        return self.tracker.wait_block(block, timeout)

    def read_block(self, block: int) -> tuple[int, bytes, int]:
        assert self.manifest is not None and self.store is not None
        off, n = self.manifest.block_range(block)
        return off, self.store.pread(off, n), self.manifest.block_crc(block)

    def chunk_verified(self, chunk: int) -> bool:
        assert self.tracker is not None
        return 0 <= chunk < len(self.tracker.verified) and self.tracker.verified[chunk] == 1

    def chunk_blocks(self, chunk: int) -> range:
        assert self.manifest is not None
        return self.manifest.chunk_blocks(chunk)

    def count_tx(self, n: int) -> None:
        with self.lock:
            self.tx_bytes += n

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        t = threading.Thread(target=self._main, name=f"job-{self.job_id}", daemon=True)
        self.threads.append(t)
        t.start()

    @property
    def alive(self) -> bool:
        return bool(self.threads) and self.threads[0].is_alive()

    def stop(self) -> None:
        self.stop_event.set()
        with self.assign_cond:
            self.assign_cond.notify_all()
        if self.tracker is not None:
            with self.tracker.cond:
                self.tracker.cond.notify_all()

    def join(self, timeout: float = 10.0) -> None:
        # only the main thread matters (it writes stats); workers are daemons blocked in I/O
        main = self.threads[0] if self.threads else None
        if main is not None and main is not threading.current_thread():
            main.join(timeout)

    def _error(self, kind: str, chunk: int = -1, from_host: str = "", detail: str = "") -> None:
        log.warning(
            "%s job %s: %s chunk=%d from=%s %s",
            self.cfg.host_id,
            self.job_id,
            kind,
            chunk,
            from_host,
            detail,
        )
        self.errors.append(
            pb.ReportError(kind=kind, chunk=chunk, from_host=from_host, detail=detail[:600])
        )

    def _journal_bits(self) -> bytes:
        """Verified-chunk bitmap as journaled (before we know the manifest geometry)."""
        path = self.cfg.models_root / ".staging" / self.model / self.version / "journal"
        try:
            doc = json.loads(path.read_bytes())
            import base64

            return base64.b64decode(doc.get("verified", ""))
        except (OSError, ValueError):
            return b""

    def _register(self) -> pb.RegisterResponse:
        if VersionStore.is_placed(self.cfg.models_root, self.model, self.version):
            have = b"\xff" * 4096 if self.tracker is None else self.tracker.bitmap()
        else:
            have = self.tracker.bitmap() if self.tracker is not None else self._journal_bits()
        free = 0
        with contextlib.suppress(OSError):
            import shutil

            self.cfg.models_root.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(self.cfg.models_root).free
        return self.agent.stub.Register(
            pb.RegisterRequest(
                job_id=self.job_id,
                host_id=self.cfg.host_id,
                rack=self.cfg.rack,
                have=have,
                free_disk_bytes=free,
                data_address=self.agent.data_address,
            ),
            timeout=30,
        )

    def _setup(self) -> bool:
        """Register, verify the manifest, open staging and load the journal. False = give up."""
        while not self.stop_event.is_set():
            try:
                reg = self._register()
                break
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    log.info("job %s not for us any more: %s", self.job_id, exc.details())
                    return False
                self.stop_event.wait(1.0)
        else:
            return False
        try:
            # Verified with this host's own trusted keys before any byte is placed.
            manifest = verify_envelope(reg.manifest_envelope, self.cfg.trusted_keys)
        except ManifestError as exc:
            self._error("MANIFEST_REJECTED", detail=str(exc))
            log.error("job %s: manifest refused: %s", self.job_id, exc)
            return False
        if (manifest.model, manifest.version) != (
            self.model,
            self.version,
        ) or manifest.digest != reg.manifest_digest:
            self._error("MANIFEST_REJECTED", detail="manifest does not match the job")
            return False
        self.manifest = manifest
        self.envelope = bytes(reg.manifest_envelope)
        self.stripes = max(1, reg.stripes)
        self._stripe_blocks = [manifest.stripe_blocks(s, self.stripes) for s in range(self.stripes)]
        self.topology_version = 0
        self.origin_uri = reg.origin_uri
        self.tracker = ChunkTracker(manifest)
        store = VersionStore(self.cfg.models_root, manifest)
        self.store = store
        try:
            # a symlink planted where this host creates or renames into: refuse before a byte
            store.check_paths()
        except UnsafePathError as exc:
            self._error("UNSAFE_PATH", detail=str(exc))
            self._give_up(HOST_FAILED, -1, f"UNSAFE_PATH {exc}")
            self.tracker = None
            return False
        if VersionStore.is_placed(self.cfg.models_root, self.model, self.version):
            try:
                store.open()
            except (OSError, ManifestError) as exc:
                self._error("PLACED_MISMATCH", detail=f"{store.final}: {exc}")
                self.tracker = None
                return False
            if not store.placed_marker_matches():
                # placed by someone else or for another manifest: serve it only if every
                # chunk hashes to this manifest (once), never on trust
                try:
                    result = scrub_placed(self.cfg.models_root, manifest)
                    bad = list(result.bad_chunks)
                except (OSError, StorageError, ManifestError):
                    bad = [0]
                if bad:
                    self._error(
                        "PLACED_MISMATCH",
                        bad[0],
                        detail=f"{store.final} does not match {manifest.digest}",
                    )
                    store.close()
                    self.tracker = None
                    return False
                store.write_placed_marker(self.envelope)
            for c in range(manifest.num_chunks):
                self.tracker.mark_verified(c)
            self.ready = True
            return True
        state = store.journal.load(manifest)
        if state is None and store.staging_dir.exists():
            # a journal for another manifest (or torn): never trust its bytes
            store.discard()
            store = VersionStore(self.cfg.models_root, manifest)
            self.store = store
        # free-disk check before creating anything: what is still missing must fit
        allocated = 0
        for f in manifest.files:
            with contextlib.suppress(OSError):
                allocated += os.stat(store.tree / f.path).st_blocks * 512
        needed = manifest.total_size - allocated
        free = store.free_bytes()
        if free < needed:
            self._error(
                "NO_SPACE", detail=f"need {needed} bytes under {self.cfg.models_root}, {free} free"
            )
            self.tracker = None  # nothing to serve
            return False
        try:
            store.open()
        except (UnsafePathError, OSError) as exc:
            self._error("UNSAFE_PATH", detail=str(exc))
            self._give_up(HOST_FAILED, -1, f"UNSAFE_PATH {exc}")
            store.close()
            self.tracker = None
            return False
        if state is not None:
            for c in state.verified:
                self.tracker.mark_verified(c)
            self.resumed_chunks = len(state.verified)
            log.info(
                "%s job %s: resuming with %d/%d chunks from journal",
                self.cfg.host_id,
                self.job_id,
                len(state.verified),
                manifest.num_chunks,
            )
        return True

    def _main(self) -> None:
        try:
            if not self._setup():
                self._report_once()
                return
            assert self.manifest is not None and self.tracker is not None and self.store is not None
            self._spawn(self._assignment_loop, "assign")
            self._spawn(self._report_loop, "report")
            if not self.ready:
                self._spawn(self._journal_loop, "journal")
                for s in range(self.stripes):
                    self._spawn(lambda s=s: self._stripe_worker(s), f"stripe-{s}")
                tracker = self.tracker
                while not self.stop_event.is_set():
                    with tracker.cond:
                        tracker.cond.wait_for(
                            lambda: tracker.all_verified() or self.stop_event.is_set(), 1.0
                        )
                    if tracker.all_verified() and not self.stop_event.is_set() and self._place():
                        break
                if not self.ready:
                    self._flush_journal()
                    if self.cancelled:
                        self.store.discard()
                    if self.failed:
                        self._report_final()
                    return
            self._write_stats()
            self.stop_event.wait()
        except Exception:
            log.exception("job %s failed on %s", self.job_id, self.cfg.host_id)
            self._error("INTERNAL", detail="agent job runner crashed; see agent log")
        finally:
            self._write_stats()

    def _spawn(self, fn: Any, name: str) -> None:
        t = threading.Thread(target=fn, name=f"{self.job_id}-{name}", daemon=True)
        self.threads.append(t)
        t.start()

    def _place(self) -> bool:
        """Every chunk passed SHA-256 (tracker) -> fsync, re-hash the staged tree, rename, READY.

        A chunk that changed in staging since it verified is never placed: it is re-fetched
        (bounded rounds), or this host gives up on the job (HOST_FAILED)."""
        assert self.store is not None and self.manifest is not None and self.tracker is not None
        self._pause_before_place()
        try:
            final = self.store.place(self.envelope)
        except StagedMismatch as exc:
            self.placement_rounds += 1
            with self.lock:
                self.staged_mismatches += len(exc.chunks)
            for c in exc.chunks:
                self._error(
                    "STAGED_MISMATCH",
                    c,
                    "",
                    f"staged chunk {c} no longer matches {self.manifest.chunks[c].digest} "
                    f"at placement (round {self.placement_rounds}); not placed",
                )
            if self.placement_rounds >= self.cfg.placement_attempts:
                self._give_up(
                    HOST_FAILED,
                    exc.chunks[0],
                    f"placement re-verification failed {self.placement_rounds} times "
                    f"(chunks {exc.chunks[:8]}); {self.store.final} not placed",
                )
                return False
            for c in exc.chunks:
                self._refetch(c, "")
            return False
        except (UnsafePathError, StorageError, OSError) as exc:
            self._give_up(HOST_FAILED, -1, f"placement refused: {exc}")
            return False
        self.ready = True
        log.info("%s job %s: placed %s", self.cfg.host_id, self.job_id, final)
        self._report_once()
        try:
            removed = gc_versions(
                self.cfg.models_root,
                self.manifest.model,
                self.cfg.retain_versions,
                {self.manifest.version},
            )
            if removed:
                log.info("retention GC removed %s/%s", self.manifest.model, removed)
        except (OSError, AgentError) as exc:
            log.warning("retention GC failed: %s", exc)
        return True

    def _pause_before_place(self) -> None:
        """Test-only hook point between the last chunk verification and placement."""
        if self.fault_pauses <= 0 or self.store is None:
            return
        self.fault_pauses -= 1
        gate = Path(self.fault_pause_gate)
        waiting = gate.with_name(gate.name + ".waiting")
        waiting.write_text(str(self.store.tree))
        deadline = time.monotonic() + 120
        while not gate.exists() and time.monotonic() < deadline and not self.stop_event.is_set():
            time.sleep(0.05)
        with contextlib.suppress(OSError):
            waiting.unlink()  # first: a test sees the gate consumed only after this
        with contextlib.suppress(OSError):
            gate.unlink()

    def _refetch(self, chunk: int, source: str) -> None:
        """Drop a chunk that failed a check and fetch it again off the stripe thread."""
        assert self.tracker is not None
        self.tracker.unmark_chunk(chunk)
        self.journal_dirty.set()
        with self.lock:
            if chunk in self.repairing:
                return
            self.repairing.add(chunk)
        self._spawn(lambda: self._repair_loop(chunk, source), f"repair-{chunk}")

    def _chunk_failure(self, chunk: int, source: str, kind: str) -> bool:
        """Count a failed verification of ``chunk`` from ``source``; True if the job is over."""
        if self.manifest is None or not 0 <= chunk < self.manifest.num_chunks:
            return False
        with self.lock:
            per = self.chunk_failures.setdefault(chunk, {})
            per[source] = per.get(source, 0) + 1
            from_source, total = per[source], sum(per.values())
            sources = sorted(per)
        limit = max(1, self.cfg.max_chunk_failures)
        # the checkpoint itself is bad if the origin failed N times, or at least two
        # independent peers did (one bad peer alone only costs this host a detour)
        bad_peers = sum(1 for src, n in per.items() if src != ORIGIN and n >= limit)
        if (source == ORIGIN and from_source >= limit) or bad_peers >= 2:
            c = self.manifest.chunks[chunk]
            files = [f for f, *_ in self.manifest.segments(c.offset, c.size)]
            objects = [object_uri(self.origin_uri, f.path, f.object_version) for f in files]
            self._give_up(
                CHUNK_FAILED,
                chunk,
                f"chunk {chunk} failed verification {total} times ({kind}, from "
                f"{', '.join(sources)}); file {', '.join(f.path for f in files)}; origin object "
                f"{', '.join(objects)}; expected {c.digest}",
                from_host=",".join(sources),
            )
            return True
        return False

    def _give_up(self, kind: str, chunk: int, detail: str, from_host: str = "") -> None:
        """Stop this job on this host (staging and journal kept) and tell the coordinator why."""
        if self.failed:
            return
        self.failed = detail
        self._error(kind, chunk, from_host, detail)
        log.error("%s job %s: %s: %s", self.cfg.host_id, self.job_id, kind, detail)
        self.stop()

    def _report_final(self) -> None:
        """Deliver the buffered errors after giving up (bounded: ~10 s of retries)."""
        for _ in range(20):
            try:
                self._report_once()
                return
            except grpc.RpcError:
                time.sleep(0.5)

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {
                "job_id": self.job_id,
                "host_id": self.cfg.host_id,
                "pid": os.getpid(),
                "ready": self.ready,
                "rx_bytes": self.rx_bytes,
                "tx_bytes": self.tx_bytes,
                "origin_bytes": self.origin_bytes,
                "crc_errors": self.crc_errors,
                "hash_mismatches": self.hash_mismatches,
                "refetched_chunks": self.refetched_chunks,
                "resumed_chunks": self.resumed_chunks,
                "swarm_chunks": self.swarm_chunks,
                "staged_mismatches": self.staged_mismatches,
                "placement_rounds": self.placement_rounds,
                "failed": self.failed,
            }

    def _write_stats(self) -> None:
        d = self.cfg.models_root / ".agent-stats"
        with contextlib.suppress(OSError):
            d.mkdir(parents=True, exist_ok=True)
            tmp = d / f"{self.job_id}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(self.stats(), sort_keys=True))
            os.replace(tmp, d / f"{self.job_id}.{os.getpid()}.json")

    # ------------------------------------------------------------------ control loops
    def _assignment_loop(self) -> None:
        backoff = 0.2
        while not self.stop_event.is_set():
            try:
                a = self.agent.stub.GetAssignment(
                    pb.GetAssignmentRequest(
                        job_id=self.job_id,
                        host_id=self.cfg.host_id,
                        known_topology_version=self.topology_version,
                        wait_ms=int(self.cfg.long_poll_s * 1000),
                    ),
                    timeout=self.cfg.long_poll_s + 10,
                )
                backoff = 0.2
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    with contextlib.suppress(grpc.RpcError):
                        self._register()
                # coordinator down: chains keep streaming on the last assignment
                self.stop_event.wait(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            if a.cancelled:
                self.cancelled = a.job_state == "CANCELLED"
                self.stop()
                return
            self._apply(a)

    def _apply(self, a: pb.Assignment) -> None:
        with self.assign_cond:
            if a.topology_version <= self.topology_version:
                return  # stale (e.g. from a deposed coordinator): never rewire backwards
            self.topology_version = a.topology_version
            self.assignment = {s.stripe: s for s in a.stripes}
            self.members = set(a.members)
            for s in a.stripes:
                if s.upstream.host_id == ORIGIN and s.origin_rate_bytes_per_s:
                    self.buckets.setdefault(
                        s.stripe, TokenBucket(s.origin_rate_bytes_per_s)
                    ).set_rate(s.origin_rate_bytes_per_s)
            self.assign_cond.notify_all()

    def _report_once(self) -> list[str]:
        now = time.monotonic()
        with self.lock:
            t0, rx0, tx0 = self._rate_mark
            if now - t0 >= 1.0:
                self.rx_bps = int((self.rx_bytes + self.origin_bytes - rx0) / (now - t0))
                self.tx_bps = int((self.tx_bytes - tx0) / (now - t0))
                self._rate_mark = (now, self.rx_bytes + self.origin_bytes, self.tx_bytes)
            errors = list(self.errors)
            req = pb.ReportProgressRequest(
                job_id=self.job_id,
                host_id=self.cfg.host_id,
                topology_version=self.topology_version,
                have=self.tracker.bitmap() if self.tracker else b"",
                rx_bytes=self.rx_bytes,
                tx_bytes=self.tx_bytes,
                origin_bytes=self.origin_bytes,
                rx_bytes_per_s=self.rx_bps,
                tx_bytes_per_s=self.tx_bps,
                errors=errors,
                ready=self.ready,
                data_address=self.agent.data_address,
                rack=self.cfg.rack,
                # READY must name the manifest the placed tree was verified against
                placed_manifest_digest=self.manifest.digest if self.ready and self.manifest else "",
                health=self.agent.health(),
                data_refusals=self.agent.data_refusals(),
            )
        resp = self.agent.stub.ReportProgress(req, timeout=10)
        for _ in errors:  # delivered; anything appended meanwhile stays buffered
            with contextlib.suppress(IndexError):
                self.errors.popleft()
        return list(resp.actions)

    def _report_loop(self) -> None:
        while not self.stop_event.wait(self.cfg.report_interval_s):
            try:
                actions = self._report_once()
            except grpc.RpcError:
                continue  # buffered; retried next interval
            if "REREGISTER" in actions:
                with contextlib.suppress(grpc.RpcError):
                    self._register()
            if "CANCEL" in actions:
                self.cancelled = True
                self.stop()
            elif "STOP" in actions:
                self.stop()

    def _journal_loop(self) -> None:
        while not self.stop_event.wait(self.cfg.journal_interval_s):
            if self.ready:
                return
            self._flush_journal()

    def _flush_journal(self) -> None:
        if self.store is None or self.tracker is None or self.manifest is None or self.store.placed:
            return
        if not self.journal_dirty.is_set():
            return
        self.journal_dirty.clear()
        with self.tracker.cond:
            verified = {i for i, v in enumerate(self.tracker.verified) if v}
        offsets = [self._first_missing(s) for s in range(self.stripes)]
        try:
            with self.store.lock:  # placement removes the staging dir under the same lock
                if self.store.placed:
                    return
                self.store.fsync()  # data first: a journaled chunk must survive a crash
                self.store.journal.save(
                    JournalState(self.manifest.digest, verified, offsets), self.manifest.num_chunks
                )
        except (OSError, StorageError) as exc:
            self.journal_dirty.set()
            log.warning("journal flush failed: %s", exc)

    # ------------------------------------------------------------------ data path
    def _first_missing(self, stripe: int) -> int:
        assert self.tracker is not None
        blocks = self._stripe_blocks[stripe]
        avail = self.tracker.available
        bpc = self.manifest.blocks_per_chunk if self.manifest else 1
        for pos, b in enumerate(blocks):
            if not avail[b] and b // bpc not in self.repairing:
                return pos
        return len(blocks)

    def _stripe_assignment(self, stripe: int) -> pb.StripeAssignment | None:
        with self.assign_cond:
            self.assign_cond.wait_for(
                lambda: stripe in self.assignment or self.stop_event.is_set(), 1.0
            )
            return self.assignment.get(stripe)

    def _stripe_worker(self, stripe: int) -> None:
        assert self.tracker is not None
        blocks = self._stripe_blocks[stripe]
        failures = 0
        while not self.stop_event.is_set():
            pos = self._first_missing(stripe)
            if pos >= len(blocks):
                with self.tracker.cond:
                    self.tracker.cond.wait(1.0)
                continue
            a = self._stripe_assignment(stripe)
            if a is None:
                continue
            upstream = a.upstream.host_id
            try:
                if upstream == ORIGIN:
                    self._pull_origin(stripe, pos, a)
                else:
                    self._pull_peer(stripe, pos, a)
                failures = 0
            except CrcMismatch as exc:
                with self.lock:
                    self.crc_errors += 1
                chunk = self.manifest.block_chunk(exc.block) if self.manifest else -1
                self._error("CRC_MISMATCH", chunk, exc.source, str(exc))
                if self._chunk_failure(chunk, exc.source, "CRC_MISMATCH"):
                    return
                self._suspect(stripe, exc.source, "BAD_DATA")
                failures += 1
                if (
                    exc.source != ORIGIN
                    and self.chunk_failures.get(chunk, {}).get(exc.source, 0)
                    >= self.cfg.max_chunk_failures
                    and self._swarm_step(stripe, exc.source)
                ):
                    failures = 0  # the chunk came from another peer; back to the chain
            except TransportError as exc:
                failures += 1
                reason = "STALLED" if "stalled" in str(exc) else "CONN_RESET"
                if failures >= 2:
                    self._suspect(stripe, upstream, reason)
                log.info("%s stripe %d: upstream %s: %s", self.cfg.host_id, stripe, upstream, exc)
                if failures >= 3 and self._swarm_step(stripe, upstream):
                    failures = 0  # progress without the chain; try the chain again next
            except (OriginError, StorageError) as exc:
                failures += 1
                self._error(
                    "ORIGIN" if isinstance(exc, OriginError) else "STORAGE", detail=str(exc)
                )
            except Exception as exc:  # a worker must never die silently: report and retry
                failures += 1
                log.exception("%s stripe %d: unexpected error", self.cfg.host_id, stripe)
                self._error("INTERNAL", detail=repr(exc))
            if failures:
                self.stop_event.wait(min(0.1 * 2 ** min(failures, 5), 2.0))

    def _swarm_step(self, stripe: int, upstream: str) -> bool:
        """Swarm mode while this stripe's chain is broken (before or without a splice): pull
        the stripe's next missing chunk from any peer that holds it, same rack first."""
        assert self.manifest is not None
        pos = self._first_missing(stripe)
        blocks = self._stripe_blocks[stripe]
        if pos >= len(blocks):
            return False
        chunk = self.manifest.block_chunk(blocks[pos])
        with self.lock:
            if chunk in self.repairing:
                return False
            self.repairing.add(chunk)
        try:
            if self._repair_chunk(chunk, {upstream}):
                with self.lock:
                    self.swarm_chunks += 1
                return True
            return False
        finally:
            with self.lock:
                self.repairing.discard(chunk)

    def _suspect(self, stripe: int, suspect: str, reason: str) -> None:
        if suspect in (ORIGIN, ""):
            return
        with contextlib.suppress(grpc.RpcError):
            resp = self.agent.stub.ReportSuspect(
                pb.ReportSuspectRequest(
                    job_id=self.job_id,
                    reporter=self.cfg.host_id,
                    suspect_host=suspect,
                    reason=reason,
                    stripe=stripe,
                ),
                timeout=5,
            )
            if resp.topology_version > self.topology_version:
                with self.assign_cond:
                    self.assign_cond.notify_all()

    def _assignment_changed(self, stripe: int, a: pb.StripeAssignment) -> bool:
        cur = self.assignment.get(stripe)
        return (
            cur is None
            or cur.upstream.host_id != a.upstream.host_id
            or cur.upstream.address != a.upstream.address
        )

    def _pull_peer(self, stripe: int, pos: int, a: pb.StripeAssignment) -> None:
        blocks = self._stripe_blocks[stripe]
        stream = StripeStream(
            a.upstream.address,
            self.job_id,
            stripe,
            pos,
            self.cfg.credits,
            self.cfg.stall_s,
            tls=self.agent.data_client,
            peer=a.upstream.host_id,
            topo=self.topology_version,
        )
        try:
            for item in stream:
                if self.stop_event.is_set() or self._assignment_changed(stripe, a):
                    return
                if item is None:
                    continue  # heartbeat: upstream alive, waiting on its own upstream
                if pos >= len(blocks) or item.block != blocks[pos]:
                    raise TransportError(
                        f"out-of-order block {item.block} at stripe position {pos}"
                    )
                self._accept(item.block, item.data, a.upstream.host_id)
                pos += 1
                if pos < len(blocks):
                    stream.grant(1)
        finally:
            stream.close()

    def _pull_origin(self, stripe: int, pos: int, a: pb.StripeAssignment) -> None:
        assert self.manifest is not None and self.tracker is not None
        if self.reader is None:
            self.reader = ManifestReader(open_origin(self.origin_uri), self.manifest)
        bucket = self.buckets.get(stripe) or TokenBucket(0)
        blocks = self._stripe_blocks[stripe]
        for p in range(pos, len(blocks)):
            if self.stop_event.is_set() or self._assignment_changed(stripe, a):
                return
            b = blocks[p]
            if self.tracker.available[b]:
                continue
            off, n = self.manifest.block_range(b)
            bucket.take(n)
            data = self.reader.read(off, n)
            with self.lock:
                self.origin_bytes += n
            self._accept(b, data, ORIGIN)

    def _accept(self, block: int, data: bytes, source: str) -> None:
        """CRC before anything else: a bad block is never written, so never forwarded."""
        assert self.manifest is not None and self.store is not None and self.tracker is not None
        if crc32c(data) != self.manifest.block_crc(block):
            raise CrcMismatch(block, source)
        if source != ORIGIN:
            self.agent.rx_limit(len(data))
            with self.lock:
                self.rx_bytes += len(data)
        chunk = self.manifest.block_chunk(block)
        if self.tracker.verified[chunk] or chunk in self.repairing:
            return
        off, _ = self.manifest.block_range(block)
        self.store.pwrite(off, data)
        last = self.manifest.chunk_blocks(chunk)[-1]
        if block == last and chunk == self.fault_disk_chunk:
            self.fault_disk_chunk = -1
            c = self.manifest.chunks[chunk]
            log.warning("fault hook: corrupting chunk %d on disk", chunk)
            self.store.pwrite(c.offset, bytes([self.store.pread(c.offset, 1)[0] ^ 0xFF]))
        self.tracker.mark_available(block)
        if block == last and self.tracker.chunk_complete_on_disk(chunk):
            self._verify_chunk(chunk, source)

    def _verify_chunk(self, chunk: int, source: str) -> None:
        assert self.store is not None and self.tracker is not None
        if self.store.chunk_matches(chunk):
            self.tracker.mark_verified(chunk)
            self.journal_dirty.set()
            return
        with self.lock:
            self.hash_mismatches += 1
        self._error("HASH_MISMATCH", chunk, source, "chunk SHA-256 does not match the manifest")
        if self._chunk_failure(chunk, source, "HASH_MISMATCH"):
            return
        # Repair off the stripe thread: the stream keeps landing later chunks meanwhile.
        self._refetch(chunk, source)

    def _repair_loop(self, chunk: int, source: str) -> None:
        """Re-fetch a chunk that failed SHA-256 from another peer (the source only as a last resort)."""
        attempt = 0
        try:
            # bounded: after repair_attempts rounds the chunk leaves `repairing` and the
            # stripe worker pulls it again from its upstream (or the origin)
            while not self.stop_event.is_set() and attempt < self.cfg.repair_attempts:
                exclude = {source} if attempt < self.cfg.repair_attempts * 2 // 3 else set()
                if self._repair_chunk(chunk, exclude):
                    return
                attempt += 1
                self.stop_event.wait(0.25)
        finally:
            with self.lock:
                self.repairing.discard(chunk)
            if self.tracker is not None:
                with self.tracker.cond:
                    self.tracker.cond.notify_all()

    def _repair_chunk(self, chunk: int, exclude: set[str]) -> bool:
        """FetchChunk from peers that hold it (same rack first), never from ``exclude``."""
        assert self.manifest is not None and self.store is not None and self.tracker is not None
        try:
            resp = self.agent.stub.FindPeers(
                pb.FindPeersRequest(
                    job_id=self.job_id,
                    host_id=self.cfg.host_id,
                    chunk=chunk,
                    exclude=sorted(exclude),
                    limit=3,
                ),
                timeout=5,
            )
            peers = list(resp.peers)
        except grpc.RpcError:
            peers = []
        want = list(self.manifest.chunk_blocks(chunk))
        for peer in peers:
            try:
                got = fetch_chunk(
                    peer.address,
                    self.job_id,
                    chunk,
                    tls=self.agent.data_client,
                    peer=peer.host_id,
                    topo=self.topology_version,
                )
            except TransportError as exc:
                log.info("repair of chunk %d from %s failed: %s", chunk, peer.host_id, exc)
                continue
            if [g.block for g in got] != want or any(
                crc32c(g.data) != self.manifest.block_crc(g.block) for g in got
            ):
                self._error("CRC_MISMATCH", chunk, peer.host_id, "repair data failed CRC32C")
                if self._chunk_failure(chunk, peer.host_id, "CRC_MISMATCH"):
                    return False
                continue
            for g in got:
                self.store.pwrite(self.manifest.block_range(g.block)[0], g.data)
                with self.lock:
                    self.rx_bytes += len(g.data)
            if self.store.chunk_matches(chunk):
                self.tracker.mark_verified(chunk)
                self.journal_dirty.set()
                with self.lock:
                    self.refetched_chunks += 1
                log.info("%s: chunk %d re-fetched from %s", self.cfg.host_id, chunk, peer.host_id)
                return True
            self._error("HASH_MISMATCH", chunk, peer.host_id, "repaired chunk failed SHA-256")
            if self._chunk_failure(chunk, peer.host_id, "HASH_MISMATCH"):
                return False
        return False


def read_bits(bitmap: bytes, n: int) -> list[int]:
    return [i for i, v in enumerate(bits_from_bitmap(bitmap, n)) if v]
