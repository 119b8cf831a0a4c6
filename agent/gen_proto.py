"""Regenerate relgate_agent/proto/*_pb2*.py from the .proto files.

Needs grpcio-tools 1.81.0 (in a tool venv): its protoc writes the protobuf 6.33 gencode the
pinned runtime reads; a newer one writes gencode the runtime refuses.

    python agent/gen_proto.py

Imports in the generated gRPC module are rewritten to be package-relative so the
generated code works as ``relgate_agent.proto.distribution_pb2``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from grpc_tools import protoc

HERE = Path(__file__).resolve().parent / "relgate_agent" / "proto"
STUB_HEADER = "# mypy: ignore-errors\n"


def main() -> int:
    for proto in sorted(HERE.glob("*.proto")):
        rc = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{HERE}",
                f"--python_out={HERE}",
                f"--pyi_out={HERE}",
                f"--grpc_python_out={HERE}",
                str(proto),
            ]
        )
        if rc != 0:
            return rc
        grpc_mod = HERE / f"{proto.stem}_pb2_grpc.py"
        text = grpc_mod.read_text()
        text = re.sub(
            rf"^import {proto.stem}_pb2 as", f"from . import {proto.stem}_pb2 as", text, flags=re.M
        )
        grpc_mod.write_text(STUB_HEADER + text)
        # The .pyi stubs are what mypy reads; make them pass the repository's ruff rules.
        # protobuf ships no types here (Message is Any), so mypy skips the generated stub.
        stub_path = HERE / f"{proto.stem}_pb2.pyi"
        stub_path.write_text(STUB_HEADER + stub_path.read_text())
        stub = str(stub_path)
        ruff = [sys.executable, "-m", "ruff"]
        subprocess.run([*ruff, "check", "--fix", "--quiet", stub], check=False)  # noqa: S603 - our argv
        subprocess.run([*ruff, "format", "--quiet", stub], check=True)  # noqa: S603 - our argv
    return 0


if __name__ == "__main__":
    sys.exit(main())
