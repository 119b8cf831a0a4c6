"""The child side of the transform protocol: host a wheel's entry point (``python -m``).

Launched by relgate with the unpacked wheel on ``PYTHONPATH``::

    python -m relgate.transforms.child module:function

It reads the Arrow IPC file named by ``RELGATE_TRANSFORM_INPUT``, calls the entry point
once per record batch (``pyarrow.RecordBatch -> pyarrow.RecordBatch | pyarrow.Table``; a
transform must treat each record on its own, relgate may batch differently on replay),
and writes an Arrow IPC stream to ``RELGATE_TRANSFORM_OUTPUT``.  Launched by Dagster
(Pipes environment present) it opens Dagster Pipes and reports rows in and out as a
custom message and a log line; launched by the CLI it runs the same way without it.

Nothing here is trusted by the parent: it re-checks the output's schema, row count and
ids.  This module imports only the standard library, pyarrow and dagster_pipes.
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
#: The custom Pipes message a transform reports (``{"rowsIn": n, "rowsOut": m}``).
ROWS_IN: Final = "rowsIn"
ROWS_OUT: Final = "rowsOut"


def _entry(spec: str) -> Callable[[Any], Any]:
    module, _, name = spec.partition(":")
    function = getattr(importlib.import_module(module), name)
    if not callable(function):
        raise TypeError(f"{spec} is not callable")
    return function  # type: ignore[no-any-return]  # a user's function, checked by the parent


def run(spec: str, report: Callable[[dict[str, int]], None]) -> None:
    """Stream the input through the entry point into the output (written with the schema
    the function returns: the parent, not this process, decides whether it is allowed)."""
    import pyarrow as pa  # noqa: PLC0415 imported here so ``--help`` costs nothing

    function = _entry(spec)
    reader = pa.ipc.open_file(pa.memory_map(os.environ[INPUT_ENV]))
    rows_in = rows_out = 0
    with pa.OSFile(os.environ[OUTPUT_ENV], "wb") as sink:
        out = None
        for i in range(reader.num_record_batches):
            batch = reader.get_batch(i)
            rows_in += batch.num_rows
            result = function(batch)
            table = result if isinstance(result, pa.Table) else pa.Table.from_batches([result])
            out = out or pa.ipc.new_stream(sink, table.schema)
            rows_out += table.num_rows
            out.write_table(table)
        (out or pa.ipc.new_stream(sink, reader.schema)).close()
    report({ROWS_IN: rows_in, ROWS_OUT: rows_out})


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m relgate.transforms.child module:function", file=sys.stderr)
        return 2
    from dagster_pipes import PipesEnvVarParamsLoader, open_dagster_pipes  # noqa: PLC0415 child only

    if not PipesEnvVarParamsLoader().is_dagster_pipes_process():  # type: ignore[no-untyped-call]  # dagster_pipes leaves __init__ unannotated
        run(argv[0], lambda _rows: None)
        return 0
    with open_dagster_pipes() as pipes:

        def report(rows: dict[str, int]) -> None:
            pipes.log.info(f"transform {argv[0]}: {rows[ROWS_IN]} rows in, {rows[ROWS_OUT]} out")
            pipes.report_custom_message(rows)

        run(argv[0], report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
