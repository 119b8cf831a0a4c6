"""The child side of the transform protocol: host a wheel's entry point (``python -m``).

Launched by relgate with the unpacked wheel on ``PYTHONPATH``::

    python -m relgate.transforms.child module:function

It reads the Arrow IPC file named by ``RELGATE_TRANSFORM_INPUT``, calls the entry point
once per record batch (``pyarrow.RecordBatch -> pyarrow.RecordBatch | pyarrow.Table``; a
transform must treat each record on its own, relgate may batch differently on replay),
and writes an Arrow IPC stream to ``RELGATE_TRANSFORM_OUTPUT``.  It is the same program
under both runners; under Dagster the ``DAGSTER_PIPES_*`` variables reach the wheel's own
code, which may speak Pipes itself (the core never imports Dagster or its Pipes library).

Nothing here is trusted by the parent: it re-checks the output's schema, row count and
ids and reports the counts it verified.  This module imports only the standard library
and pyarrow.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any, Final

#: Environment of the protocol (the parent sets both; an image's program reads them too).
INPUT_ENV: Final = "RELGATE_TRANSFORM_INPUT"
OUTPUT_ENV: Final = "RELGATE_TRANSFORM_OUTPUT"


def _entry(spec: str) -> Callable[[Any], Any]:
    module, _, name = spec.partition(":")
    function = getattr(importlib.import_module(module), name)
    if not callable(function):
        raise TypeError(f"{spec} is not callable")
    return function  # type: ignore[no-any-return]  # a user's function, checked by the parent


def run(spec: str) -> None:
    """Stream the input through the entry point into the output (written with the schema
    the function returns: the parent, not this process, decides whether it is allowed)."""
    import pyarrow as pa  # noqa: PLC0415 imported here so ``--help`` costs nothing

    function = _entry(spec)
    reader = pa.ipc.open_file(pa.memory_map(os.environ[INPUT_ENV]))
    with pa.OSFile(os.environ[OUTPUT_ENV], "wb") as sink:
        out = None
        for i in range(reader.num_record_batches):
            batch = reader.get_batch(i)
            result = function(batch)
            table = result if isinstance(result, pa.Table) else pa.Table.from_batches([result])
            out = out or pa.ipc.new_stream(sink, table.schema)
            out.write_table(table)
        (out or pa.ipc.new_stream(sink, reader.schema)).close()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m relgate.transforms.child module:function", file=sys.stderr)
        return 2
    run(argv[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
