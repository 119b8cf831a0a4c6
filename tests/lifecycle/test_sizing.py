"""The seed's arithmetic, exactly, and the shard-size recommendation."""

import json
import math

import pytest
from click.testing import CliRunner

from relgate.cli.main import main
from relgate.errors import UsageError
from relgate.lifecycle.sizing import (
    parse_count,
    payload_bytes,
    recommend_shard_mb,
    shard_count,
    size_report,
)


def test_seed_arithmetic():
    payload = payload_bytes(120_000_000_000, 4)
    assert payload == 480_000_000_000
    assert shard_count(payload, 256) == 1875 == math.ceil(120_000_000_000 * 4 / 256_000_000)
    assert shard_count(payload, 128) == 3750
    # Halving the shard size doubles the object count, not the payload.
    report = size_report(tokens=120_000_000_000, bytes_per_token=4, shard_mb=256).to_json()
    assert report["payloadBytes"] == 480_000_000_000
    assert report["payloadGB"] == 480
    assert report["alternatives"] == {"128": 3750}


def test_cli_size_json():
    out = CliRunner().invoke(
        main, ["size", "--tokens", "120e9", "--bytes-per-token", "4", "--shard-mb", "256", "--json"]
    )
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert (doc["payloadBytes"], doc["shards"], doc["alternatives"]["128"]) == (
        480_000_000_000,
        1875,
        3750,
    )


def test_cli_size_usage_errors_exit_2():
    out = CliRunner().invoke(main, ["size", "--tokens", "1.5", "--json"])
    assert out.exit_code == 2
    assert json.loads(out.stdout)["check"] == "integer"


def test_parse_count():
    assert parse_count("120e9", name="t") == 120_000_000_000
    assert parse_count("4", name="b") == 4
    for bad in ("x", "0", "-3", "2.5"):
        with pytest.raises(UsageError):
            parse_count(bad, name="t")


def test_recommendation_keeps_work_assignable_and_reads_large():
    payload = payload_bytes(120_000_000_000, 4)
    rec = recommend_shard_mb(payload, record_bytes=8192, workers=64, target_read_mb=64)
    assert rec.shard_mb * 1_000_000 >= 64 * 1_000_000
    assert rec.shards >= 64 * 8
    assert rec.records_per_shard >= 1000
    # More workers never recommend larger shards.
    more = recommend_shard_mb(payload, record_bytes=8192, workers=4096, target_read_mb=64)
    assert more.shard_mb <= rec.shard_mb
    # A tiny payload still gets a size and says why.
    tiny = recommend_shard_mb(10_000_000, record_bytes=1000, workers=8, target_read_mb=64)
    assert tiny.reasons and tiny.shards >= 1
