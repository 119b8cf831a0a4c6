"""The gate's typed contracts: wire shapes, workspace configuration, the one gate factory."""

import json

import pytest

from relgate.catalog.snapshot_table import get_snapshot
from relgate.errors import RejectedError
from relgate.gate.aliases import AliasChange
from relgate.gate.envelopes import StoredEnvelopes
from relgate.gate.fences import FenceAdvance, Fences
from relgate.gate.recheck import current_watermark, hit_subjects, recheck
from relgate.gate.transitions import Gate, open_gate
from relgate.objects.cas import ContentRef
from relgate.workspace import CONFIG_NAME, Workspace, build_object_store, default_config

D = "sha256:" + "cd" * 32


def test_fence_advance_wire_form_counts_hits():
    advance = FenceAdvance(kind="tombstone", first_seq=4, watermark=6, hits={D: [4, 6]})
    assert advance.to_json() == {
        "fence": "tombstone",
        "firstSeq": 4,
        "watermark": 6,
        "hits": {D: 2},
        "closedPermits": [],
    }
    with pytest.raises(ValueError):
        FenceAdvance(kind="other", first_seq=1, watermark=1)


def test_fences_are_frozen_and_positional():
    fences = Fences(3, 5)
    assert (fences.of("tombstone"), fences.of("benchmark"), fences.pair()) == (3, 5, (3, 5))
    with pytest.raises(ValueError):
        fences.tombstone_watermark = 4  # type: ignore[misc]


def test_alias_change_keeps_its_camel_case_keys():
    change = AliasChange(
        alias="a",
        kind="snapshot",
        generation=1,
        active_digest=D,
        tombstone_watermark=0,
        benchmark_fence=0,
        idempotent_retry=False,
    )
    assert set(change.to_json()) == {
        "alias",
        "kind",
        "generation",
        "activeDigest",
        "tombstoneWatermark",
        "benchmarkFence",
        "idempotentRetry",
    }


def test_default_config_is_the_document_init_always_wrote(tmp_path):
    doc = default_config(tmp_path)
    assert doc == {
        "catalog": {"url": f"sqlite:///{tmp_path / 'catalog.db'}"},
        "objectStore": {"kind": "local", "root": str(tmp_path / "objects")},
        "keys": {
            "signing": str(tmp_path / "keys" / "builder-v1.pem"),
            "trusted": [str(tmp_path / "keys" / "trusted")],
        },
        "sources": [],
        "snapshot": {"purpose": "demo-model-training", "transform": "registry.local/normalize:v1"},
    }


def test_a_malformed_config_is_refused_naming_the_file(g):
    path = g.ws.home / CONFIG_NAME
    doc = json.loads(path.read_text())
    assert g.ws.settings.catalog.url == doc["catalog"]["url"]
    doc["objectStore"]["colour"] = "blue"
    path.write_text(json.dumps(doc))
    with pytest.raises(RejectedError) as err:
        Workspace.open(g.ws.home)
    assert err.value.check == "schema" and CONFIG_NAME in (err.value.object or "")
    with pytest.raises(RejectedError):
        build_object_store({"kind": "local", "root": "x", "colour": "blue"})


def test_open_gate_builds_the_one_complete_gate(g):
    gate = open_gate(g.ws)
    assert isinstance(gate, Gate)
    assert isinstance(gate.envelopes, StoredEnvelopes)
    state = gate.alias("train", "release")
    assert (state.generation, state.active_digest) == (2, g.r2)
    assert [h.action for h in gate.alias_history("train")] == ["activate", "activate"]


def test_the_fence_sensors_core_reads_watermarks_and_hits(g):
    assert current_watermark(g.ws, "tombstone") == 0
    advance = open_gate(g.ws).add_benchmark_items(["sha256:" + "e" * 64], benchmark="b", actor="ev")
    assert current_watermark(g.ws, "benchmark") == advance.watermark == 1
    assert current_watermark(g.ws, "tombstone") == 0
    assert hit_subjects(g.ws, "benchmark", 0) == []  # not a member of anything
    result = recheck(g.ws, "release", g.r3, actor="sensor")
    assert (result.state, result.hits, result.reactivatable) == ("APPROVED", {}, True)
    assert result.to_json()["digest"] == g.r3


def test_recheck_refuses_a_hit_candidate_and_reports_it(g):
    row = get_snapshot(g.ws.db, g.snapshot)
    members = g.ws.membership.read(ContentRef(row.members_digest, row.members_version, 0))
    sample = members["sampleId"].to_list()[0]
    open_gate(g.ws).add_tombstones([sample], reason="gdpr", actor="dpo")
    assert current_watermark(g.ws, "tombstone") == 1
    hit = hit_subjects(g.ws, "tombstone", 0)
    assert ("release", g.r3) in hit and ("snapshot", g.snapshot) in hit
    assert hit_subjects(g.ws, "tombstone", 1) == []
    result = recheck(g.ws, "release", g.r3, actor="sensor")
    assert (result.state, result.hits, result.reactivatable) == ("INVALID", {"tombstone": 1}, False)
