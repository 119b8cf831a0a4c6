"""Checkpoints: publish a directory as a signed, content-addressed manifest at an immutable
origin, and distribute it to a local fleet of host agents.

The manifest format, its signature and the fan-out belong to the ``relgate-agent`` package;
this module wires them to the workspace: its signing key, its trusted keys, its origin
directory (embedded default) or versioned S3 bucket.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from relgate.errors import ObjectExistsError, RejectedError, RelgateError, UsageError
from relgate.workspace import Workspace

ENVELOPE_NAME = "manifest.dsse.json"


def _names(model: str, version: str) -> None:
    from relgate_agent.errors import ManifestError
    from relgate_agent.manifest import validate_name

    try:
        validate_name("model", model)
        validate_name("version", version)
    except ManifestError as exc:
        raise UsageError(str(exc), object=f"{model}/{version}", check="checkpoint-name") from None


def _copy_tree_safely(source: Path, dest: Path) -> list[str]:
    """Copy the regular files of ``source`` to ``dest`` through the agent's shared walker.

    Refuses (exit 3, naming the path and the check) symlinks, devices, FIFOs, sockets,
    mounts and hard links inside the directory; every file is opened with O_NOFOLLOW and
    must still be the inode the walk saw, so a swap between walk and copy is refused too.
    """
    from relgate_agent.fstree import CHECK_NOT_REGULAR, UnsafePathError, walk_checkpoint_tree

    def refuse(path: object, check: str, message: str) -> RejectedError:
        return RejectedError(message, object=str(path), check=f"checkpoint-{check}")

    try:
        listed = walk_checkpoint_tree(source, allow_hard_links=False)
    except UnsafePathError as exc:
        raise refuse(exc.path, exc.check, str(exc)) from None
    for f in listed:
        try:
            fd = os.open(f.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            raise refuse(
                f.path, "symlink", f"{f.path} cannot be opened without following: {exc}"
            ) from None
        with open(fd, "rb") as src:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (f.dev, f.ino) or not stat.S_ISREG(st.st_mode):
                raise refuse(
                    f.path, CHECK_NOT_REGULAR, f"{f.path} changed while it was being published"
                )
            os.set_blocking(fd, True)
            out = dest / f.rel
            out.parent.mkdir(parents=True, exist_ok=True)
            with open(out, "xb") as dst:
                shutil.copyfileobj(src, dst, 16 << 20)
                dst.flush()
                os.fsync(dst.fileno())
    return [f.rel for f in listed]


def checkpoint_root(ws: Workspace) -> Path:
    return ws.home / "checkpoints"


@dataclass(frozen=True)
class PublishedCheckpoint:
    model: str
    version: str
    digest: str
    origin_uri: str
    manifest_uri: str
    files: int
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "version": self.version,
            "manifestDigest": self.digest,
            "originUri": self.origin_uri,
            "manifestUri": self.manifest_uri,
            "files": self.files,
            "bytes": self.bytes,
        }


def publish_checkpoint(
    ws: Workspace,
    directory: str | os.PathLike[str],
    *,
    model: str,
    version: str,
    chunk_size: int,
    block_size: int,
) -> PublishedCheckpoint:
    """Copy DIR to the immutable origin ``checkpoints/<model>/<version>/`` and sign a manifest.

    The origin is written complete in a temporary directory and renamed into place, so a
    version is never visible half-copied; an existing version is never replaced.
    """
    from relgate_agent.errors import ManifestError
    from relgate_agent.manifest import build_manifest, sign_manifest

    _names(model, version)
    source = Path(directory)
    if not source.is_dir():
        raise UsageError(
            "checkpoint directory does not exist", object=str(source), check="checkpoint-dir"
        )
    target = checkpoint_root(ws) / model / version
    if target.exists():
        raise ObjectExistsError(
            "checkpoint version already published",
            object=f"{model}/{version}",
            check="conditional-create",
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{version}.", dir=target.parent))
    try:
        origin = staging / "origin"
        origin.mkdir()
        copied = _copy_tree_safely(source, origin)
        try:
            manifest = build_manifest(
                origin, model, version, chunk_size=chunk_size, block_size=block_size
            )
        except ManifestError as exc:
            raise RejectedError(str(exc), object=str(source), check="checkpoint-manifest") from None
        if [f.path for f in manifest.files] != copied:
            raise RejectedError(
                "published copy does not hold exactly the walked files",
                object=str(source),
                check="checkpoint-copy",
            )
        envelope = sign_manifest(manifest, ws.signing_key.signer)
        (staging / ENVELOPE_NAME).write_text(json.dumps(envelope, sort_keys=True))
        for path in staging.rglob("*"):
            if path.is_file():
                path.chmod(0o444)
        try:
            os.rename(staging, target)
        except OSError:
            raise ObjectExistsError(
                "checkpoint version already published",
                object=f"{model}/{version}",
                check="conditional-create",
            ) from None
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return PublishedCheckpoint(
        model,
        version,
        manifest.digest,
        str(target / "origin"),
        str(target / ENVELOPE_NAME),
        len(manifest.files),
        manifest.total_size,
    )


def list_checkpoints(ws: Workspace) -> list[dict[str, Any]]:
    from relgate_agent.manifest import TrustedKeys, verify_envelope

    trusted = TrustedKeys.load(ws.config["keys"]["trusted"])
    out = []
    for env in sorted(checkpoint_root(ws).glob(f"*/*/{ENVELOPE_NAME}")):
        manifest = verify_envelope(json.loads(env.read_text()), trusted)
        out.append(
            {
                "model": env.parent.parent.name,
                "version": env.parent.name,
                "manifestDigest": manifest.digest,
                "manifestUri": str(env),
            }
        )
    return out


def write_demo_checkpoint(
    directory: str | os.PathLike[str], *, megabytes: int = 192, seed: int = 0
) -> dict[str, Any]:
    """A real safetensors checkpoint of synthetic bf16 tensors (two shards + an index)."""
    import ml_dtypes
    import numpy as np
    from safetensors.numpy import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    hidden = 1024
    per_layer = 4 * hidden * hidden * 2  # four bf16 projection matrices
    layers = max(1, (megabytes << 20) // per_layer)
    shards: dict[str, dict[str, Any]] = {
        "model-00001-of-00002.safetensors": {},
        "model-00002-of-00002.safetensors": {},
    }
    names = list(shards)
    weight_map = {}
    for layer in range(layers):
        shard = names[0] if layer < (layers + 1) // 2 else names[1]
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            name = f"model.layers.{layer}.self_attn.{proj}.weight"
            shards[shard][name] = (
                rng.standard_normal((hidden, hidden), dtype=np.float32) * 0.02
            ).astype(ml_dtypes.bfloat16)
            weight_map[name] = shard
    for shard, tensors in shards.items():
        save_file(tensors, str(out / shard), metadata={"format": "pt"})
    (out / "model.safetensors.index.json").write_text(
        json.dumps(
            {"metadata": {"total_size": layers * per_layer}, "weight_map": weight_map},
            sort_keys=True,
            indent=1,
        )
    )
    (out / "config.json").write_text(
        json.dumps(
            {"hidden_size": hidden, "num_hidden_layers": layers, "torch_dtype": "bfloat16"},
            indent=1,
        )
    )
    return {
        "directory": str(out),
        "layers": layers,
        "bytes": sum(p.stat().st_size for p in out.iterdir()),
    }


# -- a local fleet ------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class WebhookSink:
    """Receives DistributionComplete POSTs on loopback (the deployer's side, for the demo)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    sink.events.append(json.loads(body))
                except ValueError:
                    sink.events.append({"raw": body.decode(errors="replace")})
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/distribution-complete"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def new_fleet_label() -> str:
    """Labels (and the target selector) of one local fleet run: a job started for this run
    targets exactly the agents it started, never hosts an earlier run left in the store."""
    return f"cluster=demo,fleet={secrets.token_hex(4)}"


@contextmanager
def local_fleet(
    ws: Workspace, *, hosts: int, racks: int, coordinator: str, labels: str = "cluster=demo"
) -> Iterator[list[dict[str, Any]]]:
    """Start ``hosts`` agent processes on loopback; stop each by PID on exit."""
    from relgate_agent.pki import ensure_dev_pki

    fleet_dir = ws.home / "fleet"
    procs: list[subprocess.Popen[bytes]] = []
    members = []
    agent = [sys.executable, "-m", "relgate_agent.cli"]
    # dev fleet CA + certificates under the workspace (mutual TLS on both planes, no set-up)
    pki = ensure_dev_pki(ws.home, {f"host-{i:02d}": f"rack-{i % racks}" for i in range(hosts)})
    try:
        for i in range(hosts):
            host = f"host-{i:02d}"
            root = fleet_dir / host
            (root / "models").mkdir(parents=True, exist_ok=True)
            log = open(root / "agent.log", "ab")  # noqa: SIM115 - closed with the process
            cmd = [
                *agent,
                "agent",
                "serve",
                "--host-id",
                host,
                "--rack",
                f"rack-{i % racks}",
                "--labels",
                labels,
                "--coordinator",
                coordinator,
                "--models-root",
                str(root / "models"),
                "--trusted-keys",
                *ws.config["keys"]["trusted"],
                "--listen",
                f"127.0.0.1:{free_port()}",
                "--pki",
                str(pki),
            ]
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
            members.append(
                {
                    "host": host,
                    "modelsRoot": str(root / "models"),
                    "pid": procs[-1].pid,
                    # what the coordinator enrolls (extras.serve.enroll, fleet_serve_extras)
                    "host_id": host,
                    "rack": f"rack-{i % racks}",
                    "labels": labels,
                }
            )
        yield members
    finally:
        for proc in procs:
            proc.terminate()
        deadline = time.monotonic() + 10
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def distribute(
    ws: Workspace,
    *,
    model: str,
    version: str,
    hosts: int,
    racks: int,
    ready_threshold: float = 1.0,
    origin_cap_bytes_per_s: int = 0,
    timeout_s: float = 600,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Fan a published checkpoint out to a local fleet and wait for DistributionComplete."""
    from relgate_agent.pipes import run_distribution_job

    _names(model, version)
    target = checkpoint_root(ws) / model / version
    if not (target / ENVELOPE_NAME).exists():
        raise RejectedError(
            "checkpoint version is not published",
            object=f"{model}/{version}",
            check="checkpoint-published",
        )
    from relgate_agent.client import CoordinatorRefusal
    from relgate_agent.errors import KIND_CHUNK_FAILED, AgentError

    port = free_port()
    address = f"127.0.0.1:{port}"
    # the job targets exactly the agents started here: hosts from earlier runs stay in the
    # coordinator's store but do not carry this run's label
    fleet_label = new_fleet_label()
    sink = WebhookSink()
    try:
        with local_fleet(
            ws, hosts=hosts, racks=racks, coordinator=address, labels=fleet_label
        ) as members:
            try:
                status = run_distribution_job(
                    {
                        "job": {
                            "model": model,
                            "version": version,
                            "manifest_uri": str(target / ENVELOPE_NAME),
                            "origin_uri": str(target / "origin"),
                            "target_selector": fleet_label,
                            "origin_cap_bytes_per_s": origin_cap_bytes_per_s,
                            "ready_threshold": ready_threshold,
                            "webhook_url": sink.url,
                        },
                        "serve": {
                            "listen": address,
                            "db": str(ws.home / "coordinator.sqlite"),
                            "trusted_keys": ws.config["keys"]["trusted"],
                            "min_hosts": hosts,
                            "enroll": members,
                        },
                        "pki": str(ws.home / "pki"),
                        "poll_interval_s": 0.5,
                        "timeout_s": timeout_s,
                        "wait_for_all": True,
                    },
                    log,
                )
            except CoordinatorRefusal as exc:
                raise RejectedError(
                    exc.details, object=f"{model}/{version}", check=exc.check
                ) from None
            except AgentError as exc:
                raise RelgateError(
                    str(exc), object=f"{model}/{version}", check="distribution-deadline"
                ) from None
            if status["state"] == "FAILED":
                error = str(status.get("error") or "job FAILED")
                raise RejectedError(
                    error,
                    object=f"{model}/{version}",
                    check="chunk-verification"
                    if KIND_CHUNK_FAILED in error
                    else "placement-verification",
                    digest=status.get("manifest_digest") or None,
                    details={"job": status["job_id"]},
                )
            deadline = time.monotonic() + 10
            while not sink.events and time.monotonic() < deadline:
                time.sleep(0.1)
            return {
                "status": status,
                "distributionComplete": sink.events[0] if sink.events else None,
                "fleet": members,
            }
    finally:
        sink.close()
