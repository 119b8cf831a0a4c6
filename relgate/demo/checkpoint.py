"""The demo checkpoint: a real safetensors checkpoint of synthetic bf16 tensors, published once.

Two shards plus an index and a config, like a small causal language model; the Dagster
``checkpoint_manifest`` asset and ``relgate checkpoint demo`` write it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np
import numpy.typing as npt
from safetensors.numpy import save_file

from relgate.checkpoint.listing import find_checkpoint
from relgate.checkpoint.publish import PublishedCheckpoint, publish_checkpoint
from relgate.integrity.contract import Contract
from relgate.workspace import Workspace

HIDDEN = 1024
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
#: Four bf16 projection matrices per layer.
LAYER_BYTES = len(PROJECTIONS) * HIDDEN * HIDDEN * 2


class DemoCheckpoint(Contract):
    """A synthetic checkpoint written to ``directory``: its layer count and total bytes."""

    directory: str
    layers: int
    bytes: int


class DemoCheckpointRequest(Contract):
    """What the demo distributes: ``model/version``, from ``source_dir`` or a synthetic one."""

    model: str = "demo-lm"
    version: str = "v1"
    source_dir: str = ""  # empty: a synthetic bf16 safetensors checkpoint under the workspace
    demo_megabytes: int = 192
    chunk_size: int = 64 << 20
    block_size: int = 4 << 20


def _layers(
    rng: np.random.Generator, layers: int
) -> tuple[dict[str, dict[str, npt.NDArray[np.generic]]], dict[str, str]]:
    shards: dict[str, dict[str, npt.NDArray[np.generic]]] = {name: {} for name in SHARDS}
    weight_map: dict[str, str] = {}
    for layer in range(layers):
        shard = SHARDS[0] if layer < (layers + 1) // 2 else SHARDS[1]
        for proj in PROJECTIONS:
            name = f"model.layers.{layer}.self_attn.{proj}.weight"
            shards[shard][name] = (
                rng.standard_normal((HIDDEN, HIDDEN), dtype=np.float32) * 0.02
            ).astype(ml_dtypes.bfloat16)
            weight_map[name] = shard
    return shards, weight_map


def write_demo_checkpoint(
    directory: str | os.PathLike[str], *, megabytes: int = 192, seed: int = 0
) -> DemoCheckpoint:
    """A real safetensors checkpoint of synthetic bf16 tensors (two shards + an index)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    layers = max(1, (megabytes << 20) // LAYER_BYTES)
    shards, weight_map = _layers(np.random.default_rng(seed), layers)
    for shard, tensors in shards.items():
        save_file(tensors, str(out / shard), metadata={"format": "pt"})
    (out / "model.safetensors.index.json").write_text(
        json.dumps(
            {"metadata": {"total_size": layers * LAYER_BYTES}, "weight_map": weight_map},
            sort_keys=True,
            indent=1,
        )
    )
    (out / "config.json").write_text(
        json.dumps(
            {"hidden_size": HIDDEN, "num_hidden_layers": layers, "torch_dtype": "bfloat16"},
            indent=1,
        )
    )
    return DemoCheckpoint(
        directory=str(out),
        layers=layers,
        bytes=sum(p.stat().st_size for p in out.iterdir()),
    )


def publish_demo_checkpoint(
    ws: Workspace, request: DemoCheckpointRequest, *, log: Callable[[str], None] = print
) -> PublishedCheckpoint:
    """The published ``model/version``: reused when already published (envelope verified),
    else published from ``source_dir`` or from a synthetic checkpoint written first."""
    found = find_checkpoint(ws, request.model, request.version)
    if found is not None:
        log(f"{request.model}/{request.version} already published: {found.manifest_digest}")
        return found
    source = request.source_dir
    if not source:
        source = str(ws.home / "demo-checkpoint" / request.version)
        written = write_demo_checkpoint(source, megabytes=request.demo_megabytes)
        log(f"writing a synthetic bf16 safetensors checkpoint: {written.to_json()}")
    return publish_checkpoint(
        ws,
        source,
        model=request.model,
        version=request.version,
        chunk_size=request.chunk_size,
        block_size=request.block_size,
    )
