"""A pinned transform made ready to run: fetched, verified, unpacked, launched, checked.

:class:`PinnedTransform` is what resolving a transform reference gives.  It is a
``LazyFrame -> LazyFrame`` callable (one transform process per call: what validation and
replay run per selection batch), and :meth:`PinnedTransform.staged` runs the transform
*once* over every source row of a build (an Arrow IPC file written batch by batch) and
hands selection sources that read the verified output, so a Dagster run launches the
transform process exactly once.  Built-in (source-digest) transforms run in process.
"""

from __future__ import annotations

import os
import sys
import tempfile
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from relgate.documents.source_pins import SourceEntry, SourcePin
from relgate.documents.transform_spec import BuiltinTransform, ImageTransform, WheelTransform
from relgate.errors import RejectedError
from relgate.objects.cas import ContentStore
from relgate.records.values import constant_column
from relgate.sources.source import Source
from relgate.transforms import refusals
from relgate.transforms.builtin import Transform, run_builtin
from relgate.transforms.child import INPUT_ENV, OUTPUT_ENV
from relgate.transforms.exchange import (
    SOURCE_COLUMN,
    InputFile,
    OutputFacts,
    check_output,
    output_batches,
)
from relgate.transforms.image import RunConfig, fetch_blob, unpack_image
from relgate.transforms.launcher import (
    DEFAULT_TIMEOUT_S,
    Launch,
    SubprocessRunner,
    TransformRunner,
)
from relgate.transforms.wheel import read_wheel, unpack_wheel

#: Interpreter names in an image's command that run this Python (no container runtime here).
_PYTHONS = ("python", "python3", f"python3.{sys.version_info.minor}")


@dataclass(frozen=True)
class _Prepared:
    """The unpacked artifact and how to start it."""

    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str


@dataclass(frozen=True)
class Staged:
    """A build's sources as selection should read them, the per-batch transform to apply
    on top (identity once the subprocess ran), and the verified row counts."""

    sources: dict[str, Source]
    transform: Transform
    facts: OutputFacts | None


def _identity(frame: pl.LazyFrame) -> pl.LazyFrame:
    return frame


def _base_env() -> dict[str, str]:
    env = {"PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1", "LANG": "C.UTF-8"}
    env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
    return env


def _in_root(root: Path, value: str) -> str:
    """An absolute path of the image as the file under ``root`` (when that exists)."""
    if value.startswith("/") and (root / value.lstrip("/")).exists():
        return str(root / value.lstrip("/"))
    return value


def image_command(root: Path, config: RunConfig) -> _Prepared:
    """An image's Entrypoint + Cmd run against its unpacked root, without a container.

    ``python``/``python3`` become this interpreter, absolute paths that exist in the root
    are rewritten into it, ``Env`` is passed (``PYTHONPATH`` entries rewritten the same
    way) and the working directory is ``WorkingDir`` inside the root.
    """
    argv = list(config.argv)
    if Path(argv[0]).name in _PYTHONS:
        argv[0] = sys.executable
    argv[1:] = [_in_root(root, a) for a in argv[1:]]
    env = _base_env()
    for item in config.env or ():
        name, sep, value = item.partition("=")
        if not sep or name in ("PATH", "PYTHONHOME", INPUT_ENV, OUTPUT_ENV):
            continue
        if name == "PYTHONPATH":
            value = os.pathsep.join(_in_root(root, p) for p in value.split(":"))
        env[name] = value
    cwd = root / (config.working_dir or "/").lstrip("/")
    if not cwd.resolve().is_relative_to(root.resolve()) or not cwd.is_dir():
        cwd = root
    return _Prepared(tuple(argv), env, str(cwd))


class _StagedSource(Source):
    """A source whose rows are the transform's verified output for that source."""

    kind = "transformed"

    def __init__(self, inner: Source, output: Path, schema: pa.Schema) -> None:
        super().__init__(inner.id, schema=inner.schema)
        self.inner = inner
        self.output = output
        self.arrow_schema = pa.schema([f for f in schema if f.name != SOURCE_COLUMN])

    def pin(self) -> SourcePin:
        return self.inner.pin()

    def check_readable(self, entry: SourceEntry) -> list[str]:
        return self.inner.check_readable(entry)

    def late_events(self, entry: SourceEntry) -> int:
        return self.inner.late_events(entry)

    def read(self, entry: SourceEntry) -> pa.Table:
        tables = list(self.read_batches(entry))
        return pa.concat_tables(tables) if tables else self.arrow_schema.empty_table()

    def read_batches(self, entry: SourceEntry) -> Iterator[pa.Table]:
        for batch in output_batches(self.output):
            part = batch.filter(pc.equal(batch.column(SOURCE_COLUMN), entry.id))
            if part.num_rows:
                yield pa.Table.from_batches([part]).drop_columns([SOURCE_COLUMN])


class PinnedTransform:
    """A resolved, pinned transform (see the module docstring)."""

    def __init__(
        self,
        ref: str,
        spec: WheelTransform | ImageTransform | BuiltinTransform,
        cas: ContentStore | None,
        *,
        runner: TransformRunner | None = None,
        timeout_s: int = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.ref = ref
        self.spec = spec
        self.cas = cas
        self.runner = runner or SubprocessRunner()
        self.timeout_s = timeout_s
        self._builtin = run_builtin(spec, ref) if isinstance(spec, BuiltinTransform) else None
        self._work: tempfile.TemporaryDirectory[str] | None = None
        self._prepared: _Prepared | None = None

    @property
    def digest(self) -> str:
        return self.spec.pin

    def close(self) -> None:
        if self._work is not None:
            self._work.cleanup()
            self._work, self._prepared = None, None

    def __enter__(self) -> PinnedTransform:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _prepare(self) -> tuple[_Prepared, Path]:
        if self._prepared is not None and self._work is not None:
            return self._prepared, Path(self._work.name)
        if self.cas is None:
            raise RejectedError(
                "a pinned artifact needs the workspace's object store",
                object=self.ref,
                check=refusals.DIGEST,
                digest=self.digest,
            )
        self._work = tempfile.TemporaryDirectory(prefix="relgate-transform-")
        weakref.finalize(self, self._work.cleanup)
        work = Path(self._work.name)
        if isinstance(self.spec, WheelTransform):
            self._prepared = self._prepare_wheel(self.spec, self.cas, work / "pkg")
        elif isinstance(self.spec, ImageTransform):
            (work / "rootfs").mkdir()
            config = unpack_image(self.cas, self.spec, work / "rootfs")
            self._prepared = image_command(work / "rootfs", config)
        return self._prepared, work  # type: ignore[return-value]  # set on both kinds

    def _prepare_wheel(self, spec: WheelTransform, cas: ContentStore, pkg: Path) -> _Prepared:
        data = fetch_blob(cas, spec.wheel, f"wheel {spec.filename}")
        facts = read_wheel(data, spec.filename, spec.entry_point)
        if (facts.distribution, facts.version) != (spec.distribution, spec.version):
            raise RejectedError(
                "stored wheel is not the pinned distribution version",
                object=self.ref,
                check=refusals.PACKAGE,
                digest=self.digest,
                details={"pinned": f"{spec.distribution}=={spec.version}"},
            )
        pkg.mkdir()
        unpack_wheel(data, pkg, spec.filename)
        env = {**_base_env(), "PYTHONPATH": str(pkg)}
        argv = (sys.executable, "-m", "relgate.transforms.child", spec.entry_point)
        return _Prepared(argv, env, str(pkg))

    def _run(
        self, run_dir: Path, fill: Callable[[InputFile], None], empty: pa.Schema
    ) -> tuple[pa.Schema, OutputFacts] | None:
        """Write the input, run the transform once, verify the output (None: no rows)."""
        prepared, _work = self._prepare()
        inputs = InputFile(run_dir / "input.arrow", self.ref)
        fill(inputs)
        schema = inputs.close(empty)
        if inputs.rows == 0:
            return None
        output = run_dir / "output.arrow"
        env = {**prepared.env, INPUT_ENV: str(inputs.path), OUTPUT_ENV: str(output)}
        launch = Launch(
            transform=self.ref,
            argv=prepared.argv,
            env=env,
            cwd=prepared.cwd,
            work=str(run_dir),
            timeout_s=self.timeout_s,
        )
        self.runner.run(launch)
        launch.outcome()
        facts = check_output(inputs.path, output, schema, what=self.ref, digest=self.digest)
        return schema, facts

    def __call__(self, frame: pl.LazyFrame) -> pl.LazyFrame:
        """One batch through the transform (one process)."""
        if self._builtin is not None:
            return self._builtin(frame)
        table = frame.collect().to_arrow()
        _prepared, work = self._prepare()
        with tempfile.TemporaryDirectory(dir=work) as run_dir:
            ran = self._run(Path(run_dir), lambda inputs: inputs.write(table), table.schema)
            if ran is None:
                return frame
            schema, _facts = ran
            out = pa.Table.from_batches(
                list(output_batches(Path(run_dir) / "output.arrow")), schema
            )
        result = pl.from_arrow(out)
        if not isinstance(result, pl.DataFrame):  # a Table always gives a DataFrame
            raise TypeError(f"polars gave {type(result).__name__} for an arrow table")
        return result.lazy()

    @contextmanager
    def staged(
        self, sources: Mapping[str, Source], entries: Sequence[SourceEntry]
    ) -> Iterator[Staged]:
        """Every source row of a build through the transform once; selection reads the output."""
        if self._builtin is not None:
            yield Staged(dict(sources), self._builtin, None)
            return

        def fill(inputs: InputFile) -> None:
            for entry in entries:
                for table in sources[entry.id].read_batches(entry):
                    inputs.write(
                        table.append_column(
                            SOURCE_COLUMN, constant_column(entry.id, table.num_rows)
                        )
                    )

        _prepared, work = self._prepare()
        with tempfile.TemporaryDirectory(dir=work) as run_dir:
            ran = self._run(Path(run_dir), fill, pa.schema([]))
            if ran is None:
                yield Staged(dict(sources), _identity, OutputFacts(0, 0))
                return
            schema, facts = ran
            output = Path(run_dir) / "output.arrow"
            staged = {e.id: _StagedSource(sources[e.id], output, schema) for e in entries}
            yield Staged(dict(staged), _identity, facts)
