"""Storage sizing for a token-ID payload (seed 004, "Size the representation you store").

Pure integer arithmetic in decimal units: ``payload = tokens x bytes_per_token``;
``shards = ceil(payload / shard_bytes)``.  Indexes, metadata, padding and compression are
ignored on purpose: the numbers describe the stored representation, not raw text.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from relgate.errors import UsageError
from relgate.integrity.contract import Contract

MB = 1_000_000
GB = 1_000_000_000
#: Shard sizes the recommendation chooses from (decimal MB).
STANDARD_SHARD_MB = (16, 32, 64, 128, 256, 512, 1024)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def parse_count(text: str | int | float, *, name: str) -> int:
    """``120e9`` or ``120000000000`` -> 120000000000; anything not a whole number is refused."""
    if isinstance(text, int):
        value = text
    else:
        try:
            number = float(text) if not str(text).lstrip("-").isdigit() else int(str(text))
        except ValueError:
            raise UsageError(f"{name} is not a number", object=name, check="number") from None
        if isinstance(number, float):
            if not number.is_integer():
                raise UsageError(f"{name} must be a whole number", object=name, check="integer")
            number = int(number)
        value = number
    if value <= 0:
        raise UsageError(f"{name} must be positive", object=name, check="positive")
    return value


def payload_bytes(tokens: int, bytes_per_token: int) -> int:
    return tokens * bytes_per_token


def shard_count(payload: int, shard_mb: int) -> int:
    if shard_mb <= 0:
        raise UsageError("shard size must be positive", object="shard-mb", check="positive")
    return ceil_div(payload, shard_mb * MB)


class Recommendation(Contract):
    """The recommended shard size and the work it leaves per worker."""

    shard_mb: int = Field(validation_alias="shardMB", serialization_alias="shardMB")
    shards: int
    shards_per_worker: int
    records_per_shard: int
    reasons: tuple[str, ...]


class SizeReport(Contract):
    """Payload bytes and shard counts for a token-ID payload (``relgate size``)."""

    tokens: int
    bytes_per_token: int
    payload_bytes: int
    payload_gb: int | float = Field(validation_alias="payloadGB", serialization_alias="payloadGB")
    shard_mb: int = Field(validation_alias="shardMB", serialization_alias="shardMB")
    shards: int
    alternatives: dict[str, int]
    units: str
    recommendation: Recommendation | None = None

    def to_json(self, *, exclude_none: bool = True) -> dict[str, Any]:
        """Without ``recommendation`` unless one was asked for."""
        return super().to_json(exclude_none=exclude_none)


def recommend_shard_mb(
    payload: int,
    *,
    record_bytes: int,
    workers: int,
    target_read_mb: int,
    min_shards_per_worker: int = 8,
    min_records_per_shard: int = 1000,
) -> Recommendation:
    """The largest standard shard size that still leaves enough independently assignable
    work (``min_shards_per_worker`` per worker) and is at least one target read and
    ``min_records_per_shard`` records long (records are never split across shards)."""
    if min(record_bytes, workers, target_read_mb) <= 0:
        raise UsageError(
            "record size, workers and target read size must be positive",
            object="size",
            check="positive",
        )
    lower = max(target_read_mb * MB, record_bytes * min_records_per_shard)
    upper = payload // (workers * min_shards_per_worker)
    reasons: list[str] = []
    fitting = [mb for mb in STANDARD_SHARD_MB if lower <= mb * MB <= upper]
    if fitting:
        chosen = fitting[-1]
        reasons.append(
            f"largest standard size >= max(target read {target_read_mb} MB,"
            f" {min_records_per_shard} records) and <= payload / ({workers} workers x"
            f" {min_shards_per_worker} shards)"
        )
    else:
        smaller = [mb for mb in STANDARD_SHARD_MB if record_bytes <= mb * MB <= upper]
        if smaller:
            chosen = smaller[-1]
            reasons.append(
                "payload too small for the target read size at this worker count; chose the"
                " largest size that still gives every worker enough shards"
            )
        else:
            chosen = STANDARD_SHARD_MB[0]
            reasons.append(
                "payload smaller than one standard shard per worker; some workers will idle"
            )
    shards = shard_count(payload, chosen)
    return Recommendation(
        shard_mb=chosen,
        shards=shards,
        shards_per_worker=shards // workers,
        records_per_shard=max(1, chosen * MB // record_bytes),
        reasons=tuple(reasons),
    )


def size_report(
    *,
    tokens: int,
    bytes_per_token: int,
    shard_mb: int,
    compare_mb: tuple[int, ...] = (),
    record_bytes: int | None = None,
    workers: int | None = None,
    target_read_mb: int | None = None,
) -> SizeReport:
    payload = payload_bytes(tokens, bytes_per_token)
    compare = compare_mb or ((shard_mb // 2,) if shard_mb >= 2 else ())  # noqa: PLR2004 halving needs 2 MB
    recommendation = None
    if record_bytes is not None or workers is not None or target_read_mb is not None:
        recommendation = recommend_shard_mb(
            payload,
            record_bytes=record_bytes or bytes_per_token * 2048,
            workers=workers or 1,
            target_read_mb=target_read_mb or 64,
        )
    return SizeReport(
        tokens=tokens,
        bytes_per_token=bytes_per_token,
        payload_bytes=payload,
        payload_gb=payload / GB if payload % GB else payload // GB,
        shard_mb=shard_mb,
        shards=shard_count(payload, shard_mb),
        alternatives={str(mb): shard_count(payload, mb) for mb in compare},
        units="decimal (1 MB = 10^6 bytes); indexes, metadata, padding, compression ignored",
        recommendation=recommendation,
    )
