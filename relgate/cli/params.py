"""Option types that turn malformed command-line values into usage errors (exit 2, naming
the option), never an internal error deep inside a command."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import click

#: ``30d``, ``12h``, ``90m``, ``2w``: a duration from now.
_DURATION = re.compile(r"(?P<count>[0-9]{1,6})(?P<unit>[smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: The latest expiry a duration may name (``datetime`` stops at year 9999).
_MAX_DURATION_S = 100 * 366 * 86400


def format_utc(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Expiry(click.ParamType[str, Any]):
    """A UTC instant: ISO 8601 (``2027-01-31T00:00:00Z``, a date, an offset) or a duration
    from now (``30d``, ``12h``, ``90m``, ``2w``).  Converted to ``...%fZ`` in UTC."""

    name = "expiry"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip()
        match = _DURATION.fullmatch(text)
        if match is not None:
            seconds = int(match["count"]) * _UNIT_SECONDS[match["unit"]]
            if seconds <= 0 or seconds > _MAX_DURATION_S:
                self.fail(
                    f"{text!r}: a duration must be positive and at most 100 years", param, ctx
                )
            return format_utc(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds))
        try:
            moment = dt.datetime.fromisoformat(text)
        except ValueError:
            self.fail(
                f"{text!r} is neither an ISO 8601 UTC time (2027-01-31T00:00:00Z) nor a duration"
                " (30d, 12h, 90m, 2w)",
                param,
                ctx,
            )
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.UTC)
        try:
            return format_utc(moment)
        except (OverflowError, ValueError):
            self.fail(f"{text!r} is out of range in UTC", param, ctx)


class JsonFile(click.ParamType[Any, Any]):
    """A file holding one JSON value; the decoded value (a missing, unreadable or non-JSON
    file is a usage error naming the path)."""

    name = "json-file"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = Path(str(value))
        try:
            data = path.read_bytes()
        except (OSError, ValueError) as exc:  # ValueError: a NUL in the name (not from argv)
            self.fail(f"{str(path)!r} is not readable: {exc}", param, ctx)
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as exc:
            self.fail(f"{str(path)!r} is not a JSON document: {exc}", param, ctx)


#: The most ranks a run may have (each rank is a row of every assignment epoch).
MAX_WORLD_SIZE = 1 << 17
WORLD_SIZE = click.IntRange(1, MAX_WORLD_SIZE)

EXPIRY = Expiry()
JSON_FILE = JsonFile()
