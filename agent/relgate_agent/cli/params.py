"""Params: what every relgate-agent command shares (output mode, TLS options, value types)."""

from __future__ import annotations

import functools
import json
import re
import signal
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click

from relgate_agent import logctx
from relgate_agent.logctx import LOG_FORMATS, LogFormat
from relgate_agent.pki import TlsFiles, resolve_tls

if TYPE_CHECKING:
    from relgate_agent.client import CoordinatorClient

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_COORDINATOR = "127.0.0.1:7470"
# argparse's nargs="+" options: every value up to the next option belongs to them
GREEDY_OPTIONS = frozenset({"--trusted-keys"})

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "kbit": 125,
    "mbit": 125_000,
    "gbit": 125_000_000,
    "kbps": 125,
    "mbps": 125_000,
    "gbps": 125_000_000,
}


def parse_rate(text: str) -> int:
    """Bytes per second from '100Mbit', '12.5MB', '64MiB', '1000000' ('bit'/'bps' are bits)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*(?:/s)?\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a rate: {text!r} (e.g. 100Mbit, 50MB, 64MiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_labels(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        k, sep, v = item.partition("=")
        if not sep:
            raise ValueError(f"label {item!r} is not key=value")
        out[k.strip()] = v.strip()
    return out


class _Parsed(click.ParamType[Any]):
    def __init__(self, name: str, parse: Callable[[str], Any]) -> None:
        self.name = name
        self._parse = parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self._parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


RATE = _Parsed("rate", parse_rate)
SIZE = _Parsed("size", parse_rate)
LABELS = _Parsed("labels", parse_labels)


@dataclass
class Output:
    """How results are printed: one JSON object (``--json``) or ``key: value`` lines."""

    json: bool = False
    verbose: bool = False

    def emit(self, obj: Mapping[str, object]) -> None:
        if self.json:
            print(json.dumps(obj, sort_keys=True))
            return
        for k, v in obj.items():
            print(f"{k}: {v if not isinstance(v, (dict, list)) else json.dumps(v)}")


def output() -> Output:
    return click.get_current_context().ensure_object(Output)


def _set_json(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.ensure_object(Output).json = True


def _set_verbose(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.ensure_object(Output).verbose = True


def common(fn: F) -> F:
    """``--json`` and ``-v``: accepted before the command group and after the command."""
    fn = click.option(
        "--json",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=_set_json,
        help="print exactly one JSON object on stdout",
    )(fn)
    return click.option(
        "-v", "--verbose", is_flag=True, expose_value=False, is_eager=True, callback=_set_verbose
    )(fn)


def tls_options(fn: F) -> F:
    """Mutual TLS (fleet CA): ``--pki`` or explicit ``--ca/--cert/--key``."""
    for name, help_text in reversed(
        (
            ("--pki", "PKI directory: ca.pem + <name>.pem/.key (default $RELGATE_AGENT_PKI)"),
            ("--ca", "CA certificate (overrides --pki)"),
            ("--cert", "this identity's certificate"),
            ("--key", "this identity's private key"),
        )
    ):
        fn = click.option(name, default="", help=help_text)(fn)
    return fn


def data_plane_limit_options(fn: Callable[..., None]) -> Callable[..., None]:
    """The data server's limits (handshake, request and idle timeouts, connection bounds)
    as options, passed to ``fn`` as one ``limits: DataPlaneLimits``."""

    @functools.wraps(fn)
    def packed(
        *,
        handshake_timeout: float,
        request_timeout: float,
        idle_timeout: float,
        max_conns: int,
        max_conns_per_peer: int,
        max_handshaking_per_address: int,
        **kw: Any,
    ) -> None:
        from relgate_agent.dataplane.transport import DataPlaneLimits

        limits = DataPlaneLimits(
            handshake_timeout_s=handshake_timeout,
            request_timeout_s=request_timeout,
            idle_timeout_s=idle_timeout,
            max_conns_total=max_conns,
            max_conns_per_peer=max_conns_per_peer,
            max_handshaking_per_address=max_handshaking_per_address,
        )
        fn(limits=limits, **kw)

    wrapped: Callable[..., None] = packed
    for name, kind, default in reversed(
        (
            ("--handshake-timeout", float, 5.0),
            ("--request-timeout", float, 5.0),
            ("--idle-timeout", float, 30.0),
            ("--max-conns", int, 512),
            ("--max-conns-per-peer", int, 32),
            ("--max-handshaking-per-address", int, 64),
        )
    ):
        wrapped = click.option(name, type=kind, default=default)(wrapped)
    return wrapped


@dataclass(frozen=True)
class TlsArgs:
    pki: str
    ca: str
    cert: str
    key: str

    def files(self, name: str) -> TlsFiles:
        return resolve_tls(self.pki, name, self.ca, self.cert, self.key)


def setup_logging(
    verbose: bool, log_format: LogFormat = "text", static: dict[str, Any] | None = None
) -> None:
    """stderr in ``log_format`` (logctx): text lines or one JSON object per line."""
    logctx.setup_logging(verbose, log_format, static)


def log_format_option(fn: F) -> F:
    """``--log-format [text|json]`` (a daemon's stderr)."""
    return click.option(
        "--log-format",
        type=click.Choice(LOG_FORMATS),
        default="text",
        show_default=True,
        help="stderr: text lines, or one JSON object per line (ts, level, logger, msg, "
        "and job, host, stripe, topology_version when known)",
    )(fn)


def wait_for_signal() -> None:
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(1.0):
        pass


def expand_greedy_args(argv: Sequence[str]) -> list[str]:
    """``--trusted-keys a b`` -> ``--trusted-keys a --trusted-keys b`` (click's multiple)."""
    out: list[str] = []
    greedy = ""
    for arg in argv:
        if arg == "--":
            greedy = ""
        elif arg.startswith("-"):
            greedy = arg if arg in GREEDY_OPTIONS else ""
            if greedy:
                continue
        elif greedy:
            out.append(greedy)
        out.append(arg)
    return out


@contextmanager
def operator_client(coordinator: str, tls: TlsArgs) -> Iterator[CoordinatorClient]:
    """A coordinator client with the operator's credentials, closed on the way out (the
    client module is imported here: ``--help`` and the daemons do not pay for it)."""
    from relgate_agent.client import CoordinatorClient

    client = CoordinatorClient(coordinator, tls.files("operator"))
    try:
        yield client
    finally:
        client.close()
