"""A real HTTP origin on loopback that keeps its own log of what it served.

Ranged GETs (``Range: bytes=a-b``) of the files under a directory, written in ``PIECE``-byte
writes; after each write the server logs ``(monotonic time, bytes)``. ``served()`` is the
origin's own count of bytes sent; ``worst_window(1.0)`` the most it sent in any one-second
window (the cap checks read it, not the agents' figures).
"""

from __future__ import annotations

import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

PIECE = 16 << 10


class CountingOrigin:
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.log: list[tuple[float, int]] = []
        self.requests = 0
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:
                target = (outer.root / self.path.split("?", 1)[0].lstrip("/")).resolve()
                if outer.root not in target.parents or not target.is_file():
                    self.send_error(404)
                    return
                data = target.read_bytes()
                m = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
                start, end = (int(m.group(1)), int(m.group(2))) if m else (0, len(data) - 1)
                body = data[start : end + 1]
                self.send_response(206 if m else 200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                with outer.lock:
                    outer.requests += 1
                for at in range(0, len(body), PIECE):
                    piece = body[at : at + PIECE]
                    self.wfile.write(piece)
                    with outer.lock:
                        outer.log.append((time.monotonic(), len(piece)))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def served(self) -> int:
        with self.lock:
            return sum(n for _, n in self.log)

    def worst_window(self, seconds: float = 1.0) -> int:
        """The most bytes sent in any window of ``seconds`` (windows start at each write)."""
        with self.lock:
            log = sorted(self.log)
        worst = total = lo = 0
        for t, n in log:
            total += n
            while log[lo][0] <= t - seconds:
                total -= log[lo][1]
                lo += 1
            worst = max(worst, total)
        return worst

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
