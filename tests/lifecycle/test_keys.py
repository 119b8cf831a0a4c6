"""Two spellings of one key are one key."""

import pytest

from relgate.objects.layout import canonical_key

HEX = "ab" * 32


@pytest.mark.parametrize(
    "spelling",
    [
        f"shards/sha256/{HEX}.parquet",
        f"shards//sha256/{HEX}.parquet",
        f"./shards/sha256/./{HEX}.parquet",
        f"/shards/sha256/{HEX}.parquet",
        f"shards/sha256/{HEX.upper()}.parquet",
        f"shards/SHA256/{HEX}.PARQUET",
        f"s3://bucket/shards/sha256/{HEX}.parquet",
        f"shards%2Fsha256%2F{HEX}.parquet",
        f"shards/tmp/../sha256/{HEX}.parquet",
    ],
)
def test_spellings_of_a_shard_key(spelling):
    assert canonical_key(spelling) == f"shards/sha256/{HEX}.parquet"


def test_cas_uri_and_store_prefix():
    assert canonical_key(f"cas://sha256/{HEX.upper()}") == f"cas/sha256/{HEX}"
    assert canonical_key(f"s3://b/tenant-a/cas/sha256/{HEX}", store_prefix="tenant-a/") == (
        f"cas/sha256/{HEX}"
    )


def test_distinct_keys_stay_distinct():
    assert canonical_key("raw/Forum/a.jsonl") != canonical_key("raw/forum/a.jsonl")
    assert canonical_key(f"shards/sha256/{HEX}.parquet") != canonical_key(
        f"shards/sha256/{HEX}.parquet.aesgcm"
    )
