"""Repair: re-fetch a chunk that failed verification (FetchChunk from peers that hold it).

A chunk whose SHA-256 failed is dropped and re-fetched off the stripe thread, from another
peer first (the source only as a last resort), bounded: after ``repair_attempts`` rounds
the chunk leaves ``repairing`` and its stripe worker pulls it again from the chain. While a
stripe's chain is broken, swarm mode pulls the stripe's next missing chunk the same way.
"""

from __future__ import annotations

import logging

import grpc
from relgate_trust.manifest import CheckpointManifest, crc32c

from relgate_agent.agent.bytelog import KIND_RX
from relgate_agent.agent.job import JobFiles, JobState
from relgate_agent.dataplane.transport import Block, ChunkFetch, TransportError
from relgate_agent.errors import NoSpace
from relgate_agent.proto import distribution_pb2 as pb

log = logging.getLogger(__name__)

REPAIR_WAIT_S = 0.25  # between FetchChunk rounds


def blocks_intact(m: CheckpointManifest, chunk: int, got: list[Block]) -> bool:
    """A fetched chunk is exactly its blocks, in order, each passing its signed CRC32C."""
    return [g.block for g in got] == list(m.chunk_blocks(chunk)) and all(
        crc32c(g.data) == m.block_crc(g.block) for g in got
    )


class ChunkRepair:
    def __init__(self, job: JobState, files: JobFiles) -> None:
        self.job = job
        self.files = files

    def refetch(self, chunk: int, source: str) -> None:
        """Drop a chunk that failed a check and fetch it again off the stripe thread."""
        self.files.tracker.unmark_chunk(chunk)
        self.job.journal_dirty.set()
        with self.job.lock:
            if chunk in self.job.repairing:
                return
            self.job.repairing.add(chunk)
        self.job.spawn(lambda: self._repair_loop(chunk, source), f"repair-{chunk}")

    def swarm_step(self, stripe: int, upstream: str) -> bool:
        """Swarm mode while this stripe's chain is broken (before or without a splice): pull
        the stripe's next missing chunk from any peer that holds it, same rack first."""
        job = self.job
        pos = job.first_missing(stripe)
        blocks = self.files.stripe_blocks[stripe]
        if pos >= len(blocks):
            return False
        chunk = self.files.manifest.block_chunk(blocks[pos])
        with job.lock:
            if chunk in job.repairing:
                return False
            job.repairing.add(chunk)
        try:
            if self.repair_chunk(chunk, {upstream}):
                with job.lock:
                    job.counters.swarm_chunks += 1
                return True
            return False
        finally:
            with job.lock:
                job.repairing.discard(chunk)

    def _repair_loop(self, chunk: int, source: str) -> None:
        """Re-fetch a chunk that failed SHA-256 from another peer (the source only as a last resort)."""
        job, attempts = self.job, self.job.cfg.repair_attempts
        attempt = 0
        try:
            # bounded: after repair_attempts rounds the chunk leaves `repairing` and the
            # stripe worker pulls it again from its upstream (or the origin)
            while not job.stop_event.is_set() and attempt < attempts:
                exclude = {source} if attempt < attempts * 2 // 3 else set()
                if self.repair_chunk(chunk, exclude):
                    return
                attempt += 1
                job.stop_event.wait(REPAIR_WAIT_S)
        finally:
            with job.lock:
                job.repairing.discard(chunk)
            self.files.tracker.notify()

    def holders(self, chunk: int, exclude: set[str]) -> list[pb.Peer]:
        return self.find(chunk, exclude)[0]

    def find(self, chunk: int, exclude: set[str]) -> tuple[list[pb.Peer], int]:
        """Up to 3 holders of ``chunk`` (same rack first) and how many hold it in all."""
        job = self.job
        try:
            resp = job.host.stub.FindPeers(
                pb.FindPeersRequest(
                    job_id=job.job_id,
                    host_id=job.cfg.host_id,
                    chunk=chunk,
                    exclude=sorted(exclude),
                    limit=3,
                ),
                timeout=5,
            )
            return list(resp.peers), max(resp.holders, len(resp.peers))
        except grpc.RpcError:
            return [], 0

    def fetch(self, peer: pb.Peer, chunk: int, timeout: float = 30.0) -> ChunkFetch:
        """A FetchChunk of ``chunk`` from ``peer`` for this job (run it; cancellable)."""
        job = self.job
        return ChunkFetch(
            peer.address,
            job.job_id,
            chunk,
            timeout,
            tls=job.host.data_client,
            peer=peer.host_id,
            topo=job.assignments.topology_version,
            max_block=self.files.manifest.block_size,
            max_blocks=len(self.files.manifest.chunk_blocks(chunk)),
        )

    def repair_chunk(self, chunk: int, exclude: set[str]) -> bool:
        """FetchChunk from peers that hold it (same rack first), never from ``exclude``."""
        job, m = self.job, self.files.manifest
        for peer in self.holders(chunk, exclude):
            try:
                got = self.fetch(peer, chunk).run()
            except TransportError as exc:
                log.info("repair of chunk %d from %s failed: %s", chunk, peer.host_id, exc)
                continue
            if not blocks_intact(m, chunk, got):
                job.error("CRC_MISMATCH", chunk, peer.host_id, "repair data failed CRC32C")
                if job.chunk_failure(chunk, peer.host_id, "CRC_MISMATCH"):
                    return False
                continue
            if self._write_repaired(chunk, got, peer.host_id):
                return True
            job.error("HASH_MISMATCH", chunk, peer.host_id, "repaired chunk failed SHA-256")
            if job.chunk_failure(chunk, peer.host_id, "HASH_MISMATCH"):
                return False
        return False

    def _write_repaired(self, chunk: int, got: list[Block], peer: str) -> bool:
        job, files = self.job, self.files
        try:
            for g in got:
                files.store.pwrite(files.manifest.block_range(g.block)[0], g.data)
                with job.lock:
                    job.count(KIND_RX, len(g.data))
        except NoSpace as exc:
            job.out_of_space(str(exc))
            return True  # the job is over here: nothing more to fetch
        if not files.store.chunk_matches(chunk):
            return False
        files.tracker.mark_verified(chunk)
        job.journal_dirty.set()
        with job.lock:
            job.counters.refetched_chunks += 1
        log.info("%s: chunk %d re-fetched from %s", job.cfg.host_id, chunk, peer)
        return True


__all__ = ["ChunkRepair", "blocks_intact"]
