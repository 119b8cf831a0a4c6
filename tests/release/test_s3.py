"""The same release path on S3 (moto's server): conditional creates and exact-version
reads through boto3 instead of the local store."""

import uuid

import pytest
from support.releases import state, write
from support.snapshots import build_approved

from relgate.demo.corpus import seed_demo
from relgate.documents import release_root as rm
from relgate.objects.s3 import S3ObjectStore
from relgate.release.verify.verifier import verify_release
from relgate.release.writer import shard_key
from relgate.snapshot.transform_tags import tag_transform
from relgate.workspace import Workspace, default_config


@pytest.mark.s3
def test_release_written_and_verified_on_s3(tmp_path, moto_s3_endpoint):
    bucket = f"relgate-rel-{uuid.uuid4().hex[:20]}"
    store = S3ObjectStore(bucket, endpoint_url=moto_s3_endpoint)
    store.ensure_bucket()
    try:
        home = tmp_path / "home"
        config = default_config(home)
        config["objectStore"] = {"kind": "s3", "bucket": bucket, "endpointUrl": moto_s3_endpoint}
        ws = Workspace.init(home, config)
        try:
            tag_transform(ws.db, "registry.local/normalize:v1")
            seed_demo(ws, tickets=60, forum_objects=2, per_object=10, chat_events=30)
            snapshot = build_approved(ws)
            release = write(ws, snapshot.digest, records_per_shard=25)
            d = rm.wire_shards(release.document())[0]
            # A newer version of a pinned key is never what the verifier reads.
            ws.store.put(shard_key(d["digest"], encrypted=False), b"newer bytes")
            report = verify_release(ws, release.digest, workers=0, actor="test")
            assert report.ok, report.failing
            assert state(ws, release.digest) == "VERIFIED"
        finally:
            ws.close()
    finally:
        store.destroy_bucket()
