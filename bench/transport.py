"""Data-plane choice: framed TCP (relgate_agent.dataplane.transport) vs gRPC server streaming, loopback.

Workload: one stream of 4 MiB blocks (1 GiB per run, best of 3) from an in-memory block
source to a receiver that discards them, on this machine's loopback. Reported as GB/s per
stream; the ratio framed/gRPC is what docs/distribution-design.md cites. The receiver of the real
agent also CRC32Cs each block, so that rate is reported as the per-stream compute bound.
"""

from __future__ import annotations

import tempfile
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import google_crc32c
import grpc

from bench.record import Comparison, compare
from relgate_agent.dataplane.transport import DataServer, StripeStream
from relgate_agent.pki import TlsFiles, data_client_context, data_server_context, ensure_dev_pki

BLOCK = 4 * 1024 * 1024
TOTAL = 1024 * 1024 * 1024
N_BLOCKS = TOTAL // BLOCK
PAYLOAD = bytes(range(256)) * (BLOCK // 256)


class _MemorySource:
    closed = False

    def stripe_blocks(self, stripe: int) -> list[int]:
        return list(range(N_BLOCKS))

    def wait_block(self, block: int, timeout: float) -> bool:
        return True

    def read_block(self, block: int) -> tuple[int, bytes, int]:
        return block * BLOCK, PAYLOAD, 0

    def chunk_verified(self, chunk: int) -> bool:
        return True

    def chunk_blocks(self, chunk: int) -> range:
        return range(0)

    def count_tx(self, n: int) -> None:
        pass


def framed_tcp_gbps() -> float:
    """Framed TCP as the agents run it: mutual TLS 1.3 (dev PKI in a temporary directory)."""
    src = _MemorySource()
    pki = ensure_dev_pki(Path(tempfile.mkdtemp(prefix="bench-pki-")), {"up": "r0", "down": "r0"})
    server = DataServer(
        "127.0.0.1",
        0,
        lambda job: src,
        tls=data_server_context(TlsFiles.from_pki(pki, "up")),
        authorize=lambda *_: None,
    )
    client_tls = data_client_context(TlsFiles.from_pki(pki, "down"))
    server.start()
    try:
        best = 0.0
        for _ in range(3):
            t0 = time.perf_counter()
            stream = StripeStream(
                server.address, "bench", 0, 0, credits=16, tls=client_tls, peer="up"
            )
            n = 0
            for blk in stream:
                if blk is None:
                    continue
                n += len(blk.data)
                if n < TOTAL:
                    stream.grant(1)
            stream.close()
            best = max(best, n / (time.perf_counter() - t0) / 1e9)
        return best
    finally:
        server.stop()


def grpc_stream_gbps() -> float:
    def stream(request: bytes, context: grpc.ServicerContext) -> Any:
        for _ in range(N_BLOCKS):
            yield PAYLOAD

    handler = grpc.method_handlers_generic_handler(
        "bench.Transport", {"Stream": grpc.unary_stream_rpc_method_handler(stream)}
    )
    opts = [
        ("grpc.max_send_message_length", 64 << 20),
        ("grpc.max_receive_message_length", 64 << 20),
    ]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=opts)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=opts)
    try:
        call = channel.unary_stream("/bench.Transport/Stream")
        best = 0.0
        for _ in range(3):
            t0 = time.perf_counter()
            n = sum(len(b) for b in call(b""))
            best = max(best, n / (time.perf_counter() - t0) / 1e9)
        return best
    finally:
        channel.close()
        server.stop(0).wait()


def crc32c_gbps() -> float:
    t0 = time.perf_counter()
    for _ in range(64):
        google_crc32c.value(PAYLOAD)
    return 64 * BLOCK / (time.perf_counter() - t0) / 1e9


def main() -> dict[str, Any]:
    tcp = framed_tcp_gbps()
    grpc_rate = grpc_stream_gbps()
    return {
        "workload": f"1 stream, {N_BLOCKS} x 4 MiB blocks over loopback, best of 3",
        "framed_tcp_gb_per_s": round(tcp, 3),
        "grpc_stream_gb_per_s": round(grpc_rate, 3),
        "framed_over_grpc": round(tcp / grpc_rate, 2) if grpc_rate else None,
        "crc32c_gb_per_s": round(crc32c_gbps(), 3),
    }


def comparisons(result: dict[str, Any]) -> list[Comparison]:
    """Framed TCP (the agent's data plane) against gRPC server streaming, per stream."""
    return [
        compare(
            "one stream over loopback",
            "GB/s",
            ("framed TCP", result["framed_tcp_gb_per_s"]),
            ("gRPC stream", result["grpc_stream_gb_per_s"]),
            higher_is_better=True,
        )
    ]


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
