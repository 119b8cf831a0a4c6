"""Real transform artifacts for tests: wheels (zipped by hand or built by pip) and OCI
image layouts (tar layers, config, manifest, index) written to a temp directory."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import textwrap
import zipfile
from pathlib import Path

#: A transform module body: ``transform(batch)`` over whatever the batch holds.
IDENTITY = """
def transform(batch):
    return batch
"""
#: Lower-cases lang and upper-cases text: visibly applied, schema kept.
SHOUT = """
import pyarrow as pa
import pyarrow.compute as pc

def transform(batch):
    cols = {n: batch.column(n) for n in batch.schema.names}
    cols["text"] = pc.utf8_upper(cols["text"])
    return pa.RecordBatch.from_arrays(list(cols.values()), schema=batch.schema)
"""
INVENT = """
import pyarrow as pa

def transform(batch):
    ids = batch.column("sampleId").to_pylist()
    ids[0] = "invented/" + ids[0]
    arrays = [pa.array(ids, batch.schema.field("sampleId").type) if n == "sampleId" else batch.column(n)
              for n in batch.schema.names]
    return pa.RecordBatch.from_arrays(arrays, schema=batch.schema)
"""
DUPLICATE = """
import pyarrow as pa

def transform(batch):
    return pa.Table.from_batches([batch.slice(0, 1), batch.slice(0, batch.num_rows - 1)])
"""
MORE_ROWS = """
import pyarrow as pa

def transform(batch):
    return pa.Table.from_batches([batch, batch])
"""
SCHEMA = """
import pyarrow as pa

def transform(batch):
    return batch.append_column("extra", pa.array([1] * batch.num_rows, pa.int64()))
"""
CRASH = """
def transform(batch):
    raise RuntimeError("transform blew up")
"""
HANG = """
import time

def transform(batch):
    time.sleep(3600)
    return batch
"""


def wheel_bytes(
    name: str,
    version: str,
    files: dict[str, bytes],
    *,
    entry: str | None = None,
    metadata: str | None = None,
) -> bytes:
    """A wheel zip made by hand: the files, METADATA, WHEEL, entry points and RECORD."""
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    meta = (
        metadata
        if metadata is not None
        else f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    )
    members = dict(files)
    members[f"{dist}/METADATA"] = meta.encode()
    members[f"{dist}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    if entry:
        members[f"{dist}/entry_points.txt"] = f"[relgate.transforms]\nmain = {entry}\n".encode()
    members[f"{dist}/RECORD"] = b""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for member, body in members.items():
            archive.writestr(member, body)
    return buffer.getvalue()


def write_wheel(
    out: Path, name: str, version: str, body: str, *, module: str | None = None
) -> Path:
    """A one-module wheel whose ``[relgate.transforms]`` entry point is ``transform``."""
    module = module or name.replace("-", "_")
    data = wheel_bytes(
        name,
        version,
        {f"{module}/__init__.py": textwrap.dedent(body).encode()},
        entry=f"{module}:transform",
    )
    path = out / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    path.write_bytes(data)
    return path


def write_package(root: Path, name: str, version: str, body: str) -> Path:
    """A source tree pip can build (flit_core backend, one module)."""
    module = name.replace("-", "_")
    (root / module).mkdir(parents=True)
    (root / module / "__init__.py").write_text(textwrap.dedent(body))
    (root / "pyproject.toml").write_text(
        textwrap.dedent(f"""
        [build-system]
        requires = ["flit_core>=4,<5"]
        build-backend = "flit_core.buildapi"
        [project]
        name = "{name}"
        version = "{version}"
        description = "test transform"
        [project.entry-points."relgate.transforms"]
        main = "{module}:transform"
        """)
    )
    return root


# -- OCI image layouts ---------------------------------------------------------------------
#: The program of a test image: reads RELGATE_TRANSFORM_INPUT, writes the output stream.
IMAGE_PROGRAM = """
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pyarrow as pa
from logic import transform

reader = pa.ipc.open_file(pa.memory_map(os.environ["RELGATE_TRANSFORM_INPUT"]))
with pa.OSFile(os.environ["RELGATE_TRANSFORM_OUTPUT"], "wb") as sink:
    with pa.ipc.new_stream(sink, reader.schema) as out:
        for i in range(reader.num_record_batches):
            result = transform(reader.get_batch(i))
            out.write_table(result if isinstance(result, pa.Table) else pa.Table.from_batches([result]))
"""


def layer_tar(
    files: dict[str, bytes], *, gzipped: bool = True, extra: list[tarfile.TarInfo] | None = None
) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, body in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(body))
        for info in extra or []:
            archive.addfile(info)
    raw = buffer.getvalue()
    return gzip.compress(raw, mtime=0) if gzipped else raw


def _blob(layout: Path, data: bytes) -> dict[str, object]:
    hexdigest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (layout / "blobs" / "sha256" / hexdigest).write_bytes(data)
    return {"digest": f"sha256:{hexdigest}", "size": len(data)}


def oci_layout(
    layout: Path, layers: list[bytes], *, entrypoint: list[str], gzipped: bool = True
) -> str:
    """Write an OCI image layout; the image manifest digest."""
    layout.mkdir(parents=True)
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PYTHONPATH=/app"], "WorkingDir": "/app"},
        "rootfs": {"type": "layers", "diff_ids": []},
    }
    media = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if gzipped else "")
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            **_blob(layout, json.dumps(config).encode()),
        },
        "layers": [{"mediaType": media, **_blob(layout, layer)} for layer in layers],
    }
    described = _blob(layout, json.dumps(manifest).encode())
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **described,
                "annotations": {"org.opencontainers.image.ref.name": "v1"},
            }
        ],
    }
    (layout / "index.json").write_text(json.dumps(index))
    return str(described["digest"])


def image_layout(layout: Path, logic: str, *, extra: list[tarfile.TarInfo] | None = None) -> str:
    """A Python transform image: /app/main.py runs /app/logic.py's ``transform``."""
    layer = layer_tar(
        {"app/main.py": IMAGE_PROGRAM.encode(), "app/logic.py": textwrap.dedent(logic).encode()},
        extra=extra,
    )
    return oci_layout(layout, [layer], entrypoint=["python3", "/app/main.py"])
