"""Runner: one distribution job on one host, from registration to placement.

Register and verify the signed manifest, open the staging tree (resuming from its journal)
or an already placed copy, start the control loops (:mod:`.control`) and the stripe
workers (:mod:`.stripes`), and once every chunk verified place the tree: fsync, re-hash the
staged tree, rename, READY. The runner is also the data-plane server's view of the job
(:class:`relgate_agent.dataplane.transport.BlockSource`).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import threading
import time

import grpc
from relgate_trust.dsse import MAX_ENVELOPE_BYTES
from relgate_trust.errors import ManifestError
from relgate_trust.fstree import UnsafePathError
from relgate_trust.manifest import CheckpointManifest, verify_envelope
from relgate_trust.retry import Backoff

from relgate_agent import logctx
from relgate_agent.agent.bytelog import KIND_TX, ByteLog
from relgate_agent.agent.control import ControlPlane
from relgate_agent.agent.delta import copy_held_chunks
from relgate_agent.agent.endgame import EndGame
from relgate_agent.agent.job import ChunkTracker, HostServices, JobFiles, JobState, JobStats
from relgate_agent.agent.repair import ChunkRepair
from relgate_agent.agent.stripes import StripeWorkers
from relgate_agent.attestation import sign_placement
from relgate_agent.dataplane.transport import (
    PACE_AHEAD_MAX,
    ManifestNotHeld,
    TransportError,
    fetch_manifest,
)
from relgate_agent.errors import (
    KIND_HOST_FAILED,
    KIND_LOCAL_REJECTED,
    KIND_MANIFEST_REJECTED,
    KIND_QUARANTINED,
    AgentError,
    NoSpace,
    StorageError,
)
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.staging.direct import DIRECT
from relgate_agent.staging.retention import retire_versions
from relgate_agent.staging.reverify import reverify_all
from relgate_agent.staging.storage import StagedMismatch, VersionStore, scrub_placed

log = logging.getLogger(__name__)
COORDINATOR = "coordinator"  # manifest_from: the envelope came with the Register reply
MANIFEST_FETCH_TIMEOUT_S = 10.0
MANIFEST_ROUNDS = 6  # asks of a source that does not hold the manifest yet
MANIFEST_RETRY = Backoff(0.25, max_s=2.0)
ORIGIN_READS_WAIT_S = 3.0  # the last journal flush waits this long for origin reads under way
NOT_YET = object()  # _envelope_from: the source does not hold it yet  # one source: connect, authorize, read the envelope


class JobRunner:
    """Runs one job on this host and serves its blocks to downstream peers."""

    def __init__(
        self, host: HostServices, job_id: str, model: str, version: str, rank: int = 1
    ) -> None:
        self.job = JobState(host, job_id, model, version, rank)
        self.cfg = host.config
        self.control = ControlPlane(self.job)

    # ------------------------------------------------------------------ BlockSource
    def _files(self) -> JobFiles:
        if self.job.files is None:
            raise AgentError(f"job {self.job.job_id} has no files yet")
        return self.job.files

    @property
    def closed(self) -> bool:
        return self.job.stop_event.is_set()

    def stripe_blocks(self, stripe: int) -> list[int]:
        files = self.job.files
        if files is None or not 0 <= stripe < files.stripes:
            return []
        return files.stripe_blocks[stripe]

    def wait_block(self, block: int, timeout: float) -> bool:
        return self._files().tracker.wait_block(block, timeout)

    def read_block(self, block: int) -> tuple[int, bytes, int]:
        files = self._files()
        off, n = files.manifest.block_range(block)
        return off, files.store.pread(off, n), files.manifest.block_crc(block)

    def chunk_verified(self, chunk: int) -> bool:
        verified = self._files().tracker.verified
        return 0 <= chunk < len(verified) and verified[chunk] == 1

    def chunk_blocks(self, chunk: int) -> range:
        return self._files().manifest.chunk_blocks(chunk)

    def count_tx(self, n: int) -> None:
        with self.job.lock:
            self.job.count(KIND_TX, n)

    def pace(self, stripe: int, blocks: list[int], pos: int) -> tuple[int, int]:
        avail = self._files().tracker.available
        ahead = 0
        for b in blocks[pos + 1 : pos + 1 + PACE_AHEAD_MAX]:
            if not avail[b]:
                break
            ahead += 1
        return ahead, self.job.fed_out.get(stripe, 0)

    # ------------------------------------------------------------------ lifecycle
    @property
    def serving(self) -> bool:
        """Registered with verified files: the data plane may serve this job."""
        return self.job.files is not None

    def start(self) -> None:
        main = logctx.bind(self._main, **self.job.log_fields())
        t = threading.Thread(target=main, name=f"job-{self.job.job_id}", daemon=True)
        self.job.threads.append(t)
        t.start()

    @property
    def transferring(self) -> bool:
        """Still receiving (or about to): holds back this host's lower-priority jobs."""
        return self.alive and not self.closed and not self.job.ready

    @property
    def alive(self) -> bool:
        return bool(self.job.threads) and self.job.threads[0].is_alive()

    def stop(self) -> None:
        self.job.stop()

    def join(self, timeout: float = 10.0) -> None:
        # only the main thread matters (it writes stats); workers are daemons blocked in I/O
        main = self.job.threads[0] if self.job.threads else None
        if main is not None and main is not threading.current_thread():
            main.join(timeout)

    def _main(self) -> None:
        job = self.job
        try:
            files = self._setup()
            if files is None:
                self.control.report_once()
                return
            job.files = files
            repair = ChunkRepair(job, files)
            # reports and the journal first: a long local copy must not look like a dead host
            job.spawn(self.control.report_loop, "report")
            job.spawn(self.control.journal_loop, "journal")  # and the byte log's checkpoints
            if not job.ready:
                self._copy_held(files)
                StripeWorkers(job, files, self.control, repair).start()
                job.spawn(EndGame(job, files, repair).loop, "endgame")
                self._until_placed(files, repair)
                if not job.ready:
                    if job.no_space:  # free what it staged: nothing more will fit
                        with files.store.lock:
                            files.store.discard()
                    else:
                        with job.lock:  # what the origin is still sending counts too
                            job.origin_reads_done.wait_for(
                                lambda: job.origin_reads == 0, ORIGIN_READS_WAIT_S
                            )
                        self.control.flush_journal()
                    if job.cancelled:
                        files.store.discard()
                    if job.quarantined:
                        self._scrub_quarantined(files)
                    if job.failed or job.quarantined:
                        self.control.report_final()
                    return
            self._write_stats()
            job.stop_event.wait()
            if job.quarantined:
                self._scrub_quarantined(files)
                self.control.report_final()
        except Exception as exc:  # the runner thread must report, never die silently
            log.exception("job %s failed on %s", job.job_id, self.cfg.host_id)
            # named by its type and message: the coordinator shows the operator what failed
            job.error("INTERNAL", detail=f"agent job runner stopped: {type(exc).__name__}: {exc}")
        finally:
            self._write_stats()
            self.control.checkpoint_counts()
            if job.bytelog is not None:
                job.bytelog.close()

    def _copy_held(self, files: JobFiles) -> None:
        """Delta: take the chunks other local versions hold (same signed SHA-256, re-hashed
        now) instead of transferring them, then register again so the coordinator plans
        from the bitmap this host really has."""
        job, tracker = self.job, files.tracker
        missing = [c for c in range(files.manifest.num_chunks) if not tracker.verified[c]]
        if not missing:
            return

        def write(chunk: int, data: bytes) -> None:
            files.store.pwrite(files.manifest.chunks[chunk].offset, data)
            tracker.mark_verified(chunk)

        try:
            got = copy_held_chunks(
                self.cfg.models_root,
                self.cfg.trusted_keys,
                files.manifest,
                missing,
                write,
                job.stop_event.is_set,
            )
        except NoSpace as exc:
            job.out_of_space(str(exc))
            return
        except (OSError, StorageError, ManifestError) as exc:
            log.warning(
                "%s job %s: local chunk reuse failed: %s", self.cfg.host_id, job.job_id, exc
            )
            return
        for chunk, held in got.rejected:
            job.error(
                KIND_LOCAL_REJECTED,
                chunk,
                "",
                f"{held} holds chunk {chunk} under {files.manifest.chunks[chunk].digest} but "
                "its bytes no longer hash to it; not copied",
            )
        with job.lock:
            job.counters.local_chunks += len(got.copied)
            job.counters.local_bytes += got.bytes
            job.counters.local_rejected += len(got.rejected)
        if not got.copied:
            return
        job.journal_dirty.set()
        log.info(
            "%s job %s: %d/%d chunks copied from local versions",
            self.cfg.host_id,
            job.job_id,
            len(got.copied),
            files.manifest.num_chunks,
        )
        with contextlib.suppress(grpc.RpcError):
            job.assignments.require(self.control.register().topology_version)

    def _scrub_quarantined(self, files: JobFiles) -> None:
        """Quarantined (two downstreams got bad data from us): staging for this job goes and
        every version this host holds is re-verified, a mismatching one un-placed."""
        job = self.job
        with files.store.lock:  # placement renames staging under the same lock
            files.store.discard()
        checks = reverify_all(self.cfg.models_root, self.cfg.trusted_keys)
        held = "; ".join(c.summary() for c in checks) or "none held"
        job.scrubbed = f"staging of {job.model}/{job.version} removed; re-verified: {held}"
        log.warning("%s job %s quarantined: %s", self.cfg.host_id, job.job_id, job.scrubbed)
        job.error(KIND_QUARANTINED, detail=job.scrubbed)

    def _until_placed(self, files: JobFiles, repair: ChunkRepair) -> None:
        job, tracker = self.job, files.tracker
        while not job.stop_event.is_set():
            with tracker.cond:
                tracker.cond.wait_for(
                    lambda: tracker.all_verified() or job.stop_event.is_set(), 1.0
                )
            if (
                tracker.all_verified()
                and not job.stop_event.is_set()
                and self._place(files, repair)
            ):
                return

    # ------------------------------------------------------------------ setup
    def _setup(self) -> JobFiles | None:
        """Register, verify the manifest, open staging and load the journal. None = give up."""
        job = self.job
        reg = self.control.register_until_ok()
        if reg is None:
            return None
        job.assignments.require(reg.topology_version)
        verified = self._envelope(reg)
        if verified is None:
            return None
        manifest, envelope = verified
        stripes = max(1, reg.stripes)
        files = JobFiles(
            manifest=manifest,
            envelope=envelope,
            store=VersionStore(
                self.cfg.models_root, manifest, direct=self.cfg.staging_io == DIRECT
            ),
            tracker=ChunkTracker(manifest),
            origin_uri=reg.origin_uri,
            stripe_blocks=[manifest.stripe_blocks(s, stripes) for s in range(stripes)],
        )
        # what this job's earlier processes on this host counted (bytelog.py), then a log
        # of this process's counts
        counts = ByteLog(self.cfg.models_root, job.job_id, job.lock)
        self.control.resume_counts(counts.open())
        job.bytelog = counts
        try:
            # a symlink planted where this host creates or renames into: refuse before a byte
            files.store.check_paths()
        except UnsafePathError as exc:
            job.error("UNSAFE_PATH", detail=str(exc))
            job.give_up(KIND_HOST_FAILED, -1, f"UNSAFE_PATH {exc}")
            return None
        if VersionStore.is_placed(self.cfg.models_root, job.model, job.version):
            return files if self._open_placed(files) else None
        return files if self._open_staging(files) else None

    def _envelope(self, reg: pb.RegisterResponse) -> tuple[CheckpointManifest, bytes] | None:
        """The job's manifest, verified, and its envelope: from the Register reply, else from
        the hosts it names (each envelope verified here; a bad or unreachable source is
        skipped and logged), else from the coordinator after all (a second Register)."""
        job = self.job
        if not reg.manifest_envelope:
            # a source that does not hold it yet (sent it a moment ago, verifying) is asked
            # again after 0.25 s, 0.5 s, ... (about 7 s in all); any other failure drops it
            pending = list(reg.manifest_sources)
            for attempt in range(1, MANIFEST_ROUNDS + 1):
                waiting = []
                for src in pending:
                    got = self._envelope_from(src, reg)
                    if isinstance(got, tuple):
                        return got
                    if got is NOT_YET:
                        waiting.append(src)
                pending = waiting
                if not pending or job.stop_event.wait(MANIFEST_RETRY.delay(attempt)):
                    break
            again = self.control.register_until_ok(envelope_from_peers=False)
            if again is None:
                return None
            reg = again
        envelope = bytes(reg.manifest_envelope)
        try:
            verified = self._verified_manifest(envelope, reg.manifest_digest), envelope
            job.counters.manifest_from = COORDINATOR
            return verified
        except ManifestError as exc:
            # this host's own keys refuse what the coordinator sent: it never will accept
            # it, so it gives up naming the check (every host refusing fails the job at once)
            check = getattr(exc, "check", "") or "manifest-invalid"
            job.give_up(KIND_HOST_FAILED, -1, f"{KIND_MANIFEST_REJECTED} check={check}: {exc}")
            return None

    def _envelope_from(
        self, src: pb.Peer, reg: pb.RegisterResponse
    ) -> tuple[CheckpointManifest, bytes] | object:
        """The verified manifest and envelope from ``src``; NOT_YET when it does not hold
        it yet; None when it failed (unreachable, refused, bytes that do not verify)."""
        job = self.job
        try:
            envelope = fetch_manifest(
                src.address,
                job.job_id,
                reg.manifest_digest,
                MANIFEST_FETCH_TIMEOUT_S,
                tls=job.host.data_client,
                peer=src.host_id,
                topo=reg.topology_version,
                max_bytes=MAX_ENVELOPE_BYTES,
            )
            verified = self._verified_manifest(envelope, reg.manifest_digest), envelope
        except ManifestNotHeld:
            return NOT_YET
        except (TransportError, ManifestError) as exc:
            job.error("MANIFEST_SOURCE", -1, src.host_id, str(exc)[:300])
            log.warning("job %s: manifest from %s refused: %s", job.job_id, src.host_id, exc)
            return None
        job.counters.manifest_from = src.host_id
        return verified

    def _verified_manifest(self, envelope: bytes, digest: str) -> CheckpointManifest:
        """Verified with this host's own trusted keys before any byte is placed, and the
        job's: its subject and the digest the coordinator named."""
        job = self.job
        manifest = verify_envelope(envelope, self.cfg.trusted_keys)
        subject = (manifest.model, manifest.version)
        if subject != (job.model, job.version) or manifest.digest != digest:
            raise ManifestError(
                f"manifest {manifest.digest} for {subject[0]}/{subject[1]} does not match the "
                f"job ({job.model}/{job.version}, {digest})"
            )
        return manifest

    def envelope(self) -> tuple[str, bytes] | None:
        files = self.job.files
        return (files.manifest.digest, files.envelope) if files is not None else None

    def _open_placed(self, files: JobFiles) -> bool:
        """Serve a copy placed earlier: only if it is (or hashes to) this manifest."""
        store, manifest = files.store, files.manifest
        try:
            store.open()
        except (OSError, ManifestError) as exc:
            self.job.error("PLACED_MISMATCH", detail=f"{store.final}: {exc}")
            return False
        if not store.placed_marker_matches():
            # placed by someone else or for another manifest: serve it only if every
            # chunk hashes to this manifest (once), never on trust
            try:
                bad = list(scrub_placed(self.cfg.models_root, manifest).bad_chunks)
            except (OSError, StorageError, ManifestError):
                bad = [0]
            if bad:
                # another manifest's bytes under this model/version (say a second signed
                # manifest for it): never reported placed, never overwritten; the host
                # gives up on the job naming both
                held = store.placed_marker_digest() or "no marker"
                self.job.give_up(
                    KIND_HOST_FAILED,
                    bad[0],
                    f"PLACED_MISMATCH {store.final} holds {held}, not {manifest.digest}",
                )
                store.close()
                return False
            store.write_placed_marker(files.envelope)
        for c in range(manifest.num_chunks):
            files.tracker.mark_verified(c)
        self._attest(files, reuse=True)
        self.job.ready = True
        return True

    def _open_staging(self, files: JobFiles) -> bool:
        """Open (or resume) the staging tree if what is still missing fits on disk."""
        job, manifest = self.job, files.manifest
        state = files.store.journal.load(manifest)
        if state is None and files.store.staging_dir.exists():
            # a journal for another manifest (or torn): never trust its bytes
            files.store.discard()
            files.store = VersionStore(
                self.cfg.models_root, manifest, direct=self.cfg.staging_io == DIRECT
            )
        store = files.store
        # free-disk check before creating anything: what is still missing must fit
        allocated = 0
        for f in manifest.files:
            with contextlib.suppress(OSError):
                allocated += os.stat(store.tree / f.path).st_blocks * 512
        needed = manifest.total_size - allocated
        free = store.free_bytes()
        if free < needed:
            store.discard()  # a partial staging of an earlier run is freed too
            job.out_of_space(f"need {needed} bytes under {self.cfg.models_root}, {free} free")
            return False
        try:
            store.open()
        except (UnsafePathError, OSError) as exc:
            job.error("UNSAFE_PATH", detail=str(exc))
            job.give_up(KIND_HOST_FAILED, -1, f"UNSAFE_PATH {exc}")
            store.close()
            return False
        try:
            store.write_staged_envelope(files.envelope)  # other jobs may reuse its chunks
        except (UnsafePathError, OSError) as exc:
            log.warning("%s: staged envelope not kept: %s", store.staging_dir, exc)
        if state is not None:
            for c in state.verified:
                files.tracker.mark_verified(c)
            job.counters.resumed_chunks = len(state.verified)
            log.info(
                "%s job %s: resuming with %d/%d chunks from journal",
                self.cfg.host_id,
                job.job_id,
                len(state.verified),
                manifest.num_chunks,
            )
        return True

    # ------------------------------------------------------------------ placement
    def _place(self, files: JobFiles, repair: ChunkRepair) -> bool:
        """Every chunk passed SHA-256 (tracker) -> fsync, re-hash the staged tree, rename, READY.

        A chunk that changed in staging since it verified is never placed: it is re-fetched
        (bounded rounds), or this host gives up on the job (HOST_FAILED)."""
        job = self.job
        job.hooks.before_place(files.store.tree, job.stop_event)
        try:
            final = files.store.place(files.envelope)
        except StagedMismatch as exc:
            self._staged_mismatch(files, repair, exc)
            return False
        except (UnsafePathError, StorageError, OSError) as exc:
            job.give_up(KIND_HOST_FAILED, -1, f"placement refused: {exc}")
            return False
        self._attest(files)
        job.ready = True
        log.info("%s job %s: placed %s", self.cfg.host_id, job.job_id, final)
        with contextlib.suppress(grpc.RpcError):
            # READY now if the coordinator is there; else the report loop delivers it (a
            # coordinator away must not crash the runner past retention and stats)
            self.control.report_once()
        try:
            # deployer-aware: nothing older than what serves goes until a newer one serves
            removed = retire_versions(
                self.cfg.models_root,
                files.manifest.model,
                self.cfg.retain_versions,
                frozenset({files.manifest.version}),
            )
            if removed:
                log.info("retention GC removed %s/%s", files.manifest.model, removed)
        except (OSError, AgentError) as exc:
            log.warning("retention GC failed: %s", exc)
        return True

    def _attest(self, files: JobFiles, reuse: bool = False) -> None:
        """Sign (with this host's certificate key) that the manifest's digest is placed at
        its final path, now; kept beside the marker and sent with READY. ``reuse``: a copy
        placed earlier keeps the attestation signed when it was renamed into place."""
        job, store, m = self.job, files.store, files.manifest
        signer = job.host.attestor
        if signer is None:
            return
        if reuse:
            held = store.read_placed_attestation()
            if held is not None and _attests(held, self.cfg.host_id, m.digest):
                job.attestation = held.decode("utf-8", "replace")
                return
        att = sign_placement(
            signer,
            host_id=self.cfg.host_id,
            model=m.model,
            version=m.version,
            manifest_digest=m.digest,
            path=str(store.final),
            placed_at_ms=int(time.time() * 1000),
        )
        job.attestation = json.dumps(att, sort_keys=True)
        try:
            store.write_placed_attestation(job.attestation.encode())
        except (UnsafePathError, OSError) as exc:
            log.warning("%s: placement attestation not kept: %s", store.final, exc)

    def _staged_mismatch(self, files: JobFiles, repair: ChunkRepair, exc: StagedMismatch) -> None:
        job = self.job
        job.counters.placement_rounds += 1
        rounds = job.counters.placement_rounds
        with job.lock:
            job.counters.staged_mismatches += len(exc.chunks)
        for c in exc.chunks:
            job.error(
                "STAGED_MISMATCH",
                c,
                "",
                f"staged chunk {c} no longer matches {files.manifest.chunks[c].digest} "
                f"at placement (round {rounds}); not placed",
            )
        if rounds >= self.cfg.placement_attempts:
            job.give_up(
                KIND_HOST_FAILED,
                exc.chunks[0],
                f"placement re-verification failed {rounds} times "
                f"(chunks {exc.chunks[:8]}); {files.store.final} not placed",
            )
            return
        for c in exc.chunks:
            repair.refetch(c, "")

    # ------------------------------------------------------------------ stats
    def stats(self) -> JobStats:
        return self.job.stats(os.getpid())

    def _write_stats(self) -> None:
        d = self.cfg.models_root / ".agent-stats"
        final = d / f"{self.job.job_id}.{os.getpid()}.json"
        if self.job.files is None and final.exists():
            return  # a rerun that never got its files (e.g. refused): keep what the last recorded
        with contextlib.suppress(OSError):
            d.mkdir(parents=True, exist_ok=True)
            tmp = d / f"{self.job.job_id}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(self.stats().to_json(), sort_keys=True))
            os.replace(tmp, final)


def _attests(raw: bytes, host_id: str, digest: str) -> bool:
    """A kept attestation names this host and digest (its signature is the verifier's)."""
    try:
        doc = json.loads(raw)
        body = json.loads(base64.b64decode(doc["payload"], validate=True))
        return bool(body["hostId"] == host_id and body["manifestDigest"] == digest)
    except (ValueError, KeyError, TypeError):
        return False


__all__ = ["JobRunner"]
