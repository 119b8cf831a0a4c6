"""Trusted signing keys and their revocation list, reloaded while a daemon runs.

``coordinator serve`` and ``agent serve`` load ``--trusted-keys`` (PEM files and
directories, each directory's ``revoked.json``: relgate_trust.dsse) at start-up and then
watch them: every :data:`POLL_S` seconds a :class:`TrustWatch` looks at the stat (inode,
mtime_ns, size) of every source, of every ``*.pem`` and ``revoked.json`` in a source
directory, and of the directory itself. When any of it changed, the whole set is loaded
again and, only if that load succeeds, handed to the daemon in one reference swap: a
manifest is verified against either the old set or the new one, never a mix.

Fail closed: a key file or revocation list that cannot be read or parsed, an empty set, or
a revocation list that disappeared (``check=revocations-gone``) is refused, logged at ERROR
naming the file and the check, and the previous set stays in force. Un-revoking a key takes
an explicit edit of the list (the list rewritten without its keyid), never a missing or
broken file. See docs/agent-trust-reload.md.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from relgate_trust.dsse import REVOKED_FILE, DsseError, Role, TrustedKeys

log = logging.getLogger(__name__)

POLL_S = 2.0  # how often the trusted key files' stat is looked at
MAX_FILES = 4096  # at most this many files are stat'ed per poll (bounded work)
CHECK_REVOCATIONS_GONE = "revocations-gone"

Stamp = tuple[int, int, int] | None  # (inode, mtime_ns, size); None: missing
Fingerprint = tuple[tuple[str, Stamp], ...]


def _paths(sources: Sequence[str]) -> list[Path]:
    """Every path whose change means a reload: each source, and inside a source directory
    the directory itself, its ``*.pem`` files and its revocation list."""
    roles = {r.value for r in Role}
    out: list[Path] = []
    for source in sources:
        prefix, sep, rest = source.partition("=")
        path = Path(rest if sep and prefix in roles else source)
        out.append(path)
        if path.is_dir():
            try:
                names = sorted(os.listdir(path))
            except OSError:
                continue
            out.extend(path / n for n in names if n.endswith(".pem") or n == REVOKED_FILE)
        if len(out) >= MAX_FILES:
            break
    return out[:MAX_FILES]


def _stamp(path: Path) -> Stamp:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def fingerprint(sources: Sequence[str]) -> Fingerprint:
    return tuple((str(p), _stamp(p)) for p in _paths(sources))


def _revocation_lists(fp: Fingerprint) -> frozenset[str]:
    return frozenset(p for p, st in fp if st is not None and Path(p).name == REVOKED_FILE)


class TrustWatch:
    """The daemon's trusted key set, loaded now and reloaded when its files change.

    ``apply`` receives every newly loaded set (from the watch thread); ``keys`` is the set
    in force."""

    def __init__(self, sources: Iterable[str], poll_s: float = POLL_S) -> None:
        self.sources = [os.fspath(s) for s in sources]
        self.poll_s = poll_s
        self._seen = fingerprint(self.sources)  # before the load: a change during it is seen
        self._revocations = _revocation_lists(self._seen)
        self.keys = TrustedKeys.load(self.sources)
        self.reloads = 0
        self.refusals = 0
        self._apply: Callable[[TrustedKeys], None] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> bool:
        """Reload if any watched file changed; True when a new set was put in force."""
        fp = fingerprint(self.sources)
        if fp == self._seen:
            return False
        self._seen = fp  # a refused state is not retried until a file changes again
        gone = self._revocations - _revocation_lists(fp)
        if gone:
            return self._refuse(
                ", ".join(sorted(gone)),
                CHECK_REVOCATIONS_GONE,
                "the revocation list disappeared (write an empty list to un-revoke)",
            )
        try:
            keys = TrustedKeys.load(self.sources)
        except DsseError as exc:
            return self._refuse(exc.subject, exc.check, exc.reason)
        except OSError as exc:
            return self._refuse(str(exc.filename or self.sources), "trusted-keys", str(exc))
        unrevoked = self.keys.revoked - keys.revoked
        if unrevoked:
            log.warning("trusted keys: revocation lifted for %s", ", ".join(sorted(unrevoked)))
        self._revocations = _revocation_lists(fp)
        self.keys = keys
        self.reloads += 1
        log.info(
            "trusted keys reloaded from %s: %d keys, %d revoked",
            ", ".join(self.sources),
            len(keys),
            len(keys.revoked),
        )
        if self._apply is not None:
            self._apply(keys)
        return True

    def _refuse(self, subject: str, check: str, why: str) -> bool:
        self.refusals += 1
        log.error(
            "trusted keys not reloaded: %s refused (check=%s): %s; keeping the previous set",
            subject,
            check,
            why,
        )
        return False

    def start(self, apply: Callable[[TrustedKeys], None]) -> TrustWatch:
        self._apply = apply
        if self.poll_s > 0:
            self._thread = threading.Thread(target=self._run, name="trust-watch", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception:  # the watch must outlive any one bad poll
                log.exception("trusted keys: poll failed; keeping the previous set")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


__all__ = ["CHECK_REVOCATIONS_GONE", "POLL_S", "TrustWatch", "fingerprint"]
