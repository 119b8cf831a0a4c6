"""``--config PATH``: a TOML file of the daemon's options (``coordinator serve``,
``agent serve``).

Every option has a key: its long flag without the leading dashes, dashes written as
underscores (``--metrics-listen`` -> ``metrics_listen``, ``--bypass/--no-bypass`` ->
``bypass = true|false``, ``--json`` -> ``json``, ``-v/--verbose`` -> ``verbose``). Options
given more than once (``--listen``, ``--trusted-keys``) take a list; ``labels`` takes a
table or the ``k=v,k=v`` string. Options given on the command line override the file.

The file is validated strictly against a typed model before any option is read: a key
that names no option, a value of the wrong type (``stripes = "8"``), or a value the option
itself refuses (``max_rate = "fast"``, ``origin_parallel = 999``) is a refusal, exit 3,
that names the file, the key and the check (:class:`ConfigError`). Paths are taken as
written (relative ones from the daemon's working directory): write absolute paths.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

import click
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from relgate_agent.errors import AgentError
from relgate_agent.gcpolicy import DAEMON_DEFAULT
from relgate_agent.logctx import LogFormat

F = TypeVar("F", bound=Callable[..., Any])


class ConfigError(AgentError):
    """A daemon's configuration file was refused: names the file, the key and the check
    (``readable``, ``toml``, ``unknown-key``, ``type``, ``value``)."""

    def __init__(self, path: str, key: str, check: str, detail: str) -> None:
        where = f"key {key!r}" if key else "file"
        super().__init__(f"config {path}: {where}: {check}: {detail}")
        self.path = path
        self.key = key
        self.check = check
        self.detail = detail

    def to_json(self) -> dict[str, Any]:
        return {
            "error": "rejected",
            "file": self.path,
            "key": self.key,
            "check": self.check,
            "message": str(self),
        }


class _Strict(BaseModel):
    """No key beyond the fields, no coercion (an int is a float, nothing else converts)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=False, frozen=True)


class _Shared(_Strict):
    """The keys both daemons have: output, logging, mutual TLS, metrics."""

    json_: bool = Field(False, alias="json")
    verbose: bool = False
    log_format: LogFormat = "text"
    metrics_listen: str = ""
    pki: str = ""
    ca: str = ""
    cert: str = ""
    key: str = ""
    trusted_keys: list[str] = Field(default_factory=list)
    report_interval: float = 1.0


class CoordinatorFileConfig(_Shared):
    """``coordinator serve --config``: one key per option (see ``coordinator serve --help``)."""

    listen: list[str] = Field(default_factory=list)
    db: str = ""
    stripes: int = 8
    dead_after: float = 6.0
    remove_dead_after: float = 300.0
    mass_silence: float = 0.02
    webhook: str = ""
    address_file: str = ""
    ha: bool = False
    lease_ttl: float = 10.0
    shard_by_job: bool = False
    no_splice_on_suspect: bool = False
    replica_id: str = ""
    host_ttl: float = 60.0
    #: the enrollment listener (CSRs with a bootstrap token; docs/agent-enrollment.md)
    enroll_listen: str = ""
    #: sign agents' certificate renewals with this CA (docs/agent-renewal.md)
    ca_dir: str = ""
    renew_validity: float = 72.0
    #: garbage-collector thresholds "GEN0,GEN1,GEN2" or "python" (relgate_agent/gcpolicy.py)
    gc_threshold: str = DAEMON_DEFAULT


class AgentFileConfig(_Shared):
    """``agent serve --config``: one key per option (see ``agent serve --help``)."""

    host_id: str = ""
    rack: str = ""
    labels: dict[str, str] | str = ""
    coordinator: str = ""
    coordinator_sharded: bool = False
    models_root: str = "/models"
    staging_io: Literal["buffered", "direct"] = "buffered"
    listen: str = "127.0.0.1:0"
    advertise: str = ""
    journal_interval: float = 2.0
    retain: int = 2
    max_rate: int | str = 0
    max_upload_rate: int | str = 0
    bypass: bool = True
    bypass_slow: bool = False
    origin_parallel: int = 0
    origin_range_mib: int = 0
    handshake_timeout: float = 5.0
    request_timeout: float = 5.0
    idle_timeout: float = 30.0
    max_conns: int = 512
    max_conns_per_peer: int = 32
    max_handshaking_per_address: int = 64
    #: renew the certificate when this many hours of it are left (docs/agent-renewal.md)
    renew_before: float = 24.0
    #: ask the coordinator for its CA bundle this often, seconds (docs/agent-ca-rotation.md)
    trust_poll: float = 300.0


def _check(error_type: str) -> str:
    if error_type == "extra_forbidden":
        return "unknown-key"
    if error_type.endswith(("_type", "_parsing")):
        return "type"
    return "value"


def load_config(path: str, model: type[_Strict]) -> _Strict:
    """The file at ``path`` parsed and validated as ``model`` (ConfigError otherwise)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(path, "", "readable", exc.strerror or str(exc)) from exc
    try:
        data = tomllib.loads(raw.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(path, "", "toml", str(exc)) from exc
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        # the top-level key (a union's member or a list's index is not the file's key)
        key = str(first["loc"][0]) if first["loc"] else ""
        check = _check(first["type"])
        detail = (
            f"no option --{key.replace('_', '-')} ({', '.join(sorted(model_keys(model)))})"
            if check == "unknown-key"
            else first["msg"]
        )
        raise ConfigError(path, key, check, detail) from exc


def _apply(model: type[_Strict]) -> Callable[[click.Context, click.Parameter, str], None]:
    def callback(ctx: click.Context, _param: click.Parameter, value: str) -> None:
        if not value:
            return
        cfg = load_config(value, model)
        given = cfg.model_dump(by_alias=True, exclude_unset=True)
        params = {p.name: p for p in ctx.command.params if p.name}
        for name, v in given.items():
            try:  # what the option itself refuses (a rate, a range), named here
                params[name].type_cast_value(ctx, v)
            except click.BadParameter as exc:
                raise ConfigError(value, name, "value", exc.message) from exc
        ctx.default_map = {**(ctx.default_map or {}), **given}

    return callback


def config_option(model: type[_Strict]) -> Callable[[F], F]:
    """``--config PATH``: the TOML file's keys become the options' defaults."""
    return click.option(
        "--config",
        default="",
        expose_value=False,
        is_eager=True,
        callback=_apply(model),
        metavar="PATH",
        help="TOML file: one key per option (dashes as underscores); flags override it",
    )


def option_keys(command: click.Command) -> set[str]:
    """The keys a config file for ``command`` may have: one per option but --config."""
    return {
        p.name
        for p in command.params
        if p.name and isinstance(p, click.Option) and p.name not in ("config", "help")
    }


def model_keys(model: type[_Strict]) -> set[str]:
    return {f.alias or n for n, f in model.model_fields.items()}
