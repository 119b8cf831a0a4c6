"""End-game: the last missing chunks pulled from every peer that holds them, in parallel.

Near the end of a job (at most ``max(ENDGAME_MIN_CHUNKS, chunks / ENDGAME_FRACTION)``
missing), a chunk whose stripe has received no block for ``ENDGAME_IDLE_S`` (a stalled or
slow chain, or a splice that left the stream behind) is not waited for: the agent asks the
coordinator for up to ``ENDGAME_PEERS`` holders of each such chunk (FindPeers: same rack
first; it also reports how many live hosts hold the chunk in all), takes the chunks rarest
first (fewest holders by that uncapped count, then index), and pulls up to
``ENDGAME_PARALLEL`` chunks at once, each from all of its holders at once. The first copy
whose blocks pass CRC32C and whose SHA-256 equals the signed digest is written and counted;
the other fetches of that chunk are cancelled (their sockets shut down). A chunk being
pulled here is in ``JobState.repairing``, so the stripe stream does not write it meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from relgate_trust.manifest import chunk_digest

from relgate_agent.agent.bytelog import KIND_RX
from relgate_agent.agent.job import JobFiles, JobState
from relgate_agent.agent.repair import ChunkRepair, blocks_intact
from relgate_agent.dataplane.transport import Block, ChunkFetch, TransportError
from relgate_agent.errors import NoSpace
from relgate_agent.proto import distribution_pb2 as pb

log = logging.getLogger(__name__)

ENDGAME_MIN_CHUNKS = 4  # "near the end": at most this many chunks missing ...
ENDGAME_FRACTION = 16  # ... or 1/16 of the checkpoint, whichever is more
ENDGAME_IDLE_S = 2.0  # a stripe with no block for this long is not waited for
ENDGAME_PEERS = 3  # holders asked for (and pulled from at once) per chunk
ENDGAME_PARALLEL = 4  # chunks pulled at once
ENDGAME_QUERY = 16  # chunks looked up per round
ENDGAME_ROUND_S = 0.5
ENDGAME_FETCH_S = 10.0  # a holder silent this long loses its place in the race


def rarest_first(holders: Mapping[int, int]) -> list[int]:
    """Chunks ordered by how few hosts hold them (FindPeers' uncapped count), then by
    index; unheld ones left out."""
    return sorted((c for c, n in holders.items() if n > 0), key=lambda c: (holders[c], c))


class EndGame:
    def __init__(self, job: JobState, files: JobFiles, repair: ChunkRepair) -> None:
        self.job = job
        self.files = files
        self.repair = repair
        self.started = time.monotonic()

    def near_end(self) -> bool:
        n = self.files.manifest.num_chunks
        missing = n - self.files.tracker.n_verified
        return 0 < missing <= max(ENDGAME_MIN_CHUNKS, n // ENDGAME_FRACTION)

    def idle_chunks(self) -> list[int]:
        """Missing chunks (not being fetched already) whose stripe has gone quiet."""
        job, files = self.job, self.files
        now, k = time.monotonic(), files.stripes
        verified = files.tracker.verified
        with job.lock:
            seen = dict(job.stripe_seen)
            busy = set(job.repairing)
        out = []
        for c in range(files.manifest.num_chunks):
            if verified[c] or c in busy:
                continue
            if now - max(seen.get(c % k, 0.0), self.started) >= ENDGAME_IDLE_S:
                out.append(c)
                if len(out) >= ENDGAME_QUERY:
                    break
        return out

    def loop(self) -> None:
        job = self.job
        with ThreadPoolExecutor(ENDGAME_PARALLEL, thread_name_prefix="endgame") as pool:
            while not job.stop_event.wait(ENDGAME_ROUND_S):
                if self.files.tracker.all_verified():
                    return
                if not self.near_end() or job.host.outranked(job.job_id):
                    continue
                found = {c: self.repair.find(c, set()) for c in self.idle_chunks()}
                order = rarest_first({c: n for c, (peers, n) in found.items() if peers})
                if order:
                    peers = [found[c][0][:ENDGAME_PEERS] for c in order]
                    list(pool.map(self._pull, order, peers))

    def _pull(self, chunk: int, peers: Sequence[pb.Peer]) -> None:
        job = self.job
        with job.lock:
            if chunk in job.repairing or self.files.tracker.verified[chunk]:
                return
            job.repairing.add(chunk)
        try:
            self._race(chunk, peers)
        finally:
            with job.lock:
                job.repairing.discard(chunk)
            self.files.tracker.notify()

    def _race(self, chunk: int, peers: Sequence[pb.Peer]) -> None:
        """Fetch ``chunk`` from every peer at once; the first verified copy wins, the other
        fetches are cancelled."""
        job = self.job
        fetches = [(p.host_id, self.repair.fetch(p, chunk, ENDGAME_FETCH_S)) for p in peers]
        won = threading.Lock()
        winner: list[str] = []

        def one(peer: str, f: ChunkFetch) -> None:
            try:
                got = f.run()
            except TransportError as exc:
                if f.cancelled:
                    with job.lock:
                        job.counters.endgame_cancelled += 1
                else:
                    log.info("end-game: chunk %d from %s failed: %s", chunk, peer, exc)
                return
            n = sum(len(b.data) for b in got)
            job.host.rx_limit(n)
            with job.lock:
                job.count(KIND_RX, n)
            if not self._valid(chunk, got, peer):
                return
            with won:
                if winner or self.files.tracker.verified[chunk]:
                    with job.lock:
                        job.counters.endgame_duplicate_bytes += n
                    return
                self._write(chunk, got)
                winner.append(peer)
            for other_peer, other in fetches:
                if other_peer != peer:
                    other.cancel()

        threads = [
            threading.Thread(
                target=one, args=fp, name=f"{job.job_id}-eg-{chunk}-{fp[0]}", daemon=True
            )
            for fp in fetches
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(2 * ENDGAME_FETCH_S)
        if winner:
            with job.lock:
                job.counters.endgame_chunks += 1
            log.info("%s: end-game chunk %d from %s", job.cfg.host_id, chunk, winner[0])

    def _valid(self, chunk: int, got: list[Block], peer: str) -> bool:
        job, m = self.job, self.files.manifest
        if not blocks_intact(m, chunk, got):
            job.error("CRC_MISMATCH", chunk, peer, "end-game data failed CRC32C")
            job.chunk_failure(chunk, peer, "CRC_MISMATCH")
            return False
        if chunk_digest(b"".join(g.data for g in got)) != m.chunks[chunk].digest:
            job.error("HASH_MISMATCH", chunk, peer, "end-game chunk failed SHA-256")
            job.chunk_failure(chunk, peer, "HASH_MISMATCH")
            return False
        return True

    def _write(self, chunk: int, got: list[Block]) -> None:
        files = self.files
        try:
            for g in got:
                files.store.pwrite(files.manifest.block_range(g.block)[0], g.data)
        except NoSpace as exc:
            self.job.out_of_space(str(exc))
            return
        files.tracker.mark_verified(chunk)
        self.job.journal_dirty.set()


__all__ = ["EndGame", "rarest_first"]
