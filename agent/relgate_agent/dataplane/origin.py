"""Checkpoint origins: ranged reads of the files a manifest names.

An origin is where the writer put the checkpoint (a local directory or an S3 prefix). Only
stripe roots read from it; everyone else reads from a peer. Reads pin the exact object
version when the manifest records one.
"""

from __future__ import annotations

import http.client
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from relgate_trust.manifest import CheckpointManifest, FileEntry, validate_relative_path

from relgate_agent.errors import OriginError

S3_POOL = 64  # connections one S3 client keeps (every stripe root of a host shares it)
WIRE_PIECE = 256 << 10  # a range's body is read (and counted) in pieces of this size

# told the size of each piece of a range's body as it comes off the wire
Received = Callable[[int], None]


def _uncounted(n: int) -> None:
    return None


def read_counted(read: Callable[[int], bytes], length: int, received: Received) -> bytes:
    """A range's body from a stream: at most ``length + 1`` bytes (an origin that sends
    more is caught by the caller's length check, never buffered whole), in WIRE_PIECE
    reads, each told to ``received`` as it comes: a read that fails halfway has counted
    what the origin sent before it failed."""
    parts: list[bytes] = []
    got = 0
    while got <= length:
        piece = read(min(WIRE_PIECE, length + 1 - got))
        if not piece:
            break
        received(len(piece))
        parts.append(piece)
        got += len(piece)
    return b"".join(parts)


class Origin(Protocol):
    """Ranged reads of one file under the origin root; ``received`` is told each piece of
    the body as it arrives (the job's origin bytes are what the origin sent)."""

    def read_range(
        self,
        path: str,
        start: int,
        length: int,
        version_id: str = "",
        received: Received = _uncounted,
    ) -> bytes: ...

    def read_object(self, path: str) -> bytes: ...


class LocalDirOrigin:
    """A directory on a local (or mounted) filesystem."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def _path(self, path: str) -> Path:
        return self.root / validate_relative_path(path)

    def read_range(
        self,
        path: str,
        start: int,
        length: int,
        version_id: str = "",
        received: Received = _uncounted,
    ) -> bytes:
        try:
            fd = os.open(self._path(path), os.O_RDONLY)
        except OSError as exc:
            raise OriginError(f"origin file {path} cannot be opened: {exc}") from exc
        try:
            buf = os.pread(fd, length, start)
        finally:
            os.close(fd)
        received(len(buf))
        if len(buf) != length:
            raise OriginError(
                f"origin file {path} returned {len(buf)} bytes at {start}, wanted {length}"
            )
        return buf

    def read_object(self, path: str) -> bytes:
        try:
            return self._path(path).read_bytes()
        except OSError as exc:
            raise OriginError(f"origin object {path} cannot be read: {exc}") from exc


class S3Origin:
    """An S3 prefix; ranged GETs pin ``VersionId`` when the manifest records one."""

    def __init__(
        self, bucket: str, prefix: str = "", client: Any = None, endpoint_url: str = ""
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        if client is None:
            import boto3  # noqa: PLC0415 - lazy: only stripe roots reading from S3 need it
            from botocore.config import Config  # noqa: PLC0415 - as boto3

            client = boto3.client(
                "s3",
                endpoint_url=endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None,
                # a connection per range GET in flight (rangefetch: 16 per stripe root)
                config=Config(max_pool_connections=S3_POOL),
            )
        self.client = client

    def _key(self, path: str) -> str:
        validate_relative_path(path)
        return f"{self.prefix}/{path}" if self.prefix else path

    def read_range(
        self,
        path: str,
        start: int,
        length: int,
        version_id: str = "",
        received: Received = _uncounted,
    ) -> bytes:
        kwargs: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self._key(path),
            "Range": f"bytes={start}-{start + length - 1}",
        }
        if version_id:
            kwargs["VersionId"] = version_id
        try:
            stream = self.client.get_object(**kwargs)["Body"]
            try:
                body = read_counted(stream.read, length, received)
            finally:
                stream.close()
        except Exception as exc:  # botocore raises many types; name the object either way
            raise OriginError(
                f"s3://{self.bucket}/{kwargs['Key']} range {start}+{length}: {exc}"
            ) from exc
        if len(body) != length:
            raise OriginError(
                f"s3://{self.bucket}/{kwargs['Key']} returned {len(body)} bytes, wanted {length}"
            )
        return bytes(body)

    def read_object(self, path: str) -> bytes:
        key = self._key(path)
        try:
            return bytes(self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())
        except Exception as exc:
            raise OriginError(f"s3://{self.bucket}/{key} cannot be read: {exc}") from exc


class HttpOrigin:
    """An HTTP(S) base URL serving the checkpoint files; ranged GETs with ``Range: bytes=``."""

    def __init__(self, base_url: str, timeout: float = 60.0) -> None:
        self.base = base_url.rstrip("/")
        self.timeout = timeout

    def _get(
        self, path: str, headers: dict[str, str], bound: int = -1, received: Received = _uncounted
    ) -> bytes:
        """The body (at most ``bound`` + 1 bytes, counted as it comes, when ``bound`` >= 0)."""
        url = f"{self.base}/{validate_relative_path(path)}"
        req = urllib.request.Request(url, headers=headers)  # noqa: S310 - http(s) origin URL
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 - http(s) origin URL
                if bound < 0:
                    return bytes(resp.read())
                return read_counted(resp.read, bound, received)
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            # HTTPException: a body cut short (IncompleteRead), a malformed status line
            raise OriginError(f"{url} {headers.get('Range', '')}: {exc!r}") from exc

    def read_range(
        self,
        path: str,
        start: int,
        length: int,
        version_id: str = "",
        received: Received = _uncounted,
    ) -> bytes:
        span = {"Range": f"bytes={start}-{start + length - 1}"}
        body = self._get(path, span, length, received)
        if len(body) != length:
            raise OriginError(
                f"{self.base}/{path} returned {len(body)} bytes at {start}, wanted {length}"
            )
        return body

    def read_object(self, path: str) -> bytes:
        return self._get(path, {})


def open_origin(uri: str) -> Origin:
    """``s3://bucket/prefix``, ``http(s)://base``, ``file:///dir`` or a plain directory path."""
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        return S3Origin(parsed.netloc, parsed.path)
    if parsed.scheme in ("http", "https"):
        return HttpOrigin(uri)
    if parsed.scheme == "file":
        return LocalDirOrigin(parsed.path)
    if parsed.scheme == "":
        return LocalDirOrigin(uri)
    raise OriginError(f"unsupported origin URI scheme in {uri!r}")


def object_uri(origin_uri: str, path: str, version_id: str = "") -> str:
    """The origin object a manifest file is read from, as a URI (for error messages)."""
    if not origin_uri:
        return f"<no origin>/{path}"
    parsed = urlparse(origin_uri)
    base = origin_uri.rstrip("/")
    if parsed.scheme == "s3":
        return f"{base}/{path}" + (f"?versionId={version_id}" if version_id else "")
    if parsed.scheme in ("http", "https", "file"):
        return f"{base}/{path}"
    return str(Path(origin_uri) / path)


def read_uri(uri: str) -> bytes:
    """Read one whole object named by URI (used for manifest envelopes)."""
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        key = parsed.path.lstrip("/")
        parent, _, name = key.rpartition("/")
        return S3Origin(parsed.netloc, parent).read_object(name)
    if parsed.scheme in ("http", "https"):
        base, _, name = uri.rpartition("/")
        return HttpOrigin(base).read_object(name)
    path = parsed.path if parsed.scheme == "file" else uri
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise OriginError(f"{uri} cannot be read: {exc}") from exc


class ManifestReader:
    """Reads byte ranges of the concatenated checkpoint space from an origin."""

    def __init__(self, origin: Origin, manifest: CheckpointManifest) -> None:
        self.origin = origin
        self.manifest = manifest

    def read(self, offset: int, length: int, received: Received = _uncounted) -> bytes:
        """The bytes at ``offset``, file by file; ``received`` told each piece as it comes."""
        parts: list[bytes] = []
        seg: tuple[FileEntry, int, int, int]
        for seg in self.manifest.segments(offset, length):
            f, foff, n, _ = seg
            parts.append(self.origin.read_range(f.path, foff, n, f.object_version, received))
        return b"".join(parts)
