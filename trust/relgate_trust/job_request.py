"""The distribution job request: what the core (or any operator) sends and the agent runs.

One typed request, written once: the core builds a :class:`JobRequest`, Dagster Pipes
carries :meth:`JobRequest.to_extras` to ``relgate-agent pipes``, and the agent reads it
back with :meth:`JobRequest.from_extras` (the document it validates, documented in
``relgate_agent.pipes``).  :class:`JobSpec` is the job itself as the coordinator stores it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from relgate_trust.errors import JobRequestError


@dataclass(frozen=True)
class JobSpec:
    """What an operator asks for (CreateJob); stored with the job, defaults resolved."""

    model: str = ""
    version: str = ""
    manifest_uri: str = ""
    origin_uri: str = ""
    target_selector: str = ""
    priority: str = "normal"
    origin_cap_bytes_per_s: int = 0
    ready_threshold_ppm: int = 0  # 0 = the default (99.5 %)
    deadline_s: int = 0
    stripes: int = 0  # 0 = the coordinator's default
    webhook_url: str = ""
    job_id: str = ""
    origin_dc: str = ""  # the origin's data center ("" = the DC with the most target hosts)

    @classmethod
    def from_stored(cls, doc: Mapping[str, Any]) -> JobSpec:
        """From the stored JSON (unknown keys ignored, missing ones default)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = doc.get(f.name)
            if value is not None:
                values[f.name] = int(value) if isinstance(f.default, int) else str(value)
        return cls(**values)

    def to_stored(self) -> dict[str, object]:
        """The stored JSON (snake_case keys, as the job rows have always held)."""
        return asdict(self)

    def with_(self, **changes: Any) -> JobSpec:
        return replace(self, **changes)


@dataclass(frozen=True)
class Enrollment:
    host_id: str
    rack: str
    labels: Mapping[str, str]

    def to_extras(self) -> dict[str, Any]:
        return {"host_id": self.host_id, "rack": self.rack, "labels": dict(self.labels)}

    @staticmethod
    def parse_labels(labels: str | Mapping[str, str]) -> dict[str, str]:
        """Labels as a mapping, or spelled ``k=v,k2=v2``."""
        if isinstance(labels, str):
            return dict(item.split("=", 1) for item in labels.split(",") if "=" in item)
        return dict(labels)

    @classmethod
    def from_extras(cls, doc: Mapping[str, Any]) -> Enrollment:
        labels = cls.parse_labels(doc.get("labels") or {})
        return cls(str(doc["host_id"]), str(doc["rack"]), labels)


@dataclass(frozen=True)
class ServeSpec:
    """A coordinator to run in this process for the job's life (``extras.serve``)."""

    db: str
    trusted_keys: tuple[str, ...]
    listen: str = "127.0.0.1:7470"
    stripes: int = 8
    dead_after_s: float = 6.0
    min_hosts: int = 0
    min_hosts_wait_s: float = 120.0
    enroll: tuple[Enrollment, ...] = ()

    def to_extras(self) -> dict[str, Any]:
        return {
            "db": self.db,
            "trusted_keys": list(self.trusted_keys),
            "listen": self.listen,
            "stripes": self.stripes,
            "dead_after_s": self.dead_after_s,
            "min_hosts": self.min_hosts,
            "min_hosts_wait_s": self.min_hosts_wait_s,
            "enroll": [e.to_extras() for e in self.enroll],
        }

    @classmethod
    def from_extras(cls, doc: Mapping[str, Any]) -> ServeSpec:
        return cls(
            db=str(doc["db"]),
            trusted_keys=tuple(str(k) for k in doc["trusted_keys"]),
            listen=str(doc.get("listen", "127.0.0.1:7470")),
            stripes=int(doc.get("stripes", 8)),
            dead_after_s=float(doc.get("dead_after_s", 6.0)),
            min_hosts=int(doc.get("min_hosts", 0)),
            min_hosts_wait_s=float(doc.get("min_hosts_wait_s", 120)),
            enroll=tuple(Enrollment.from_extras(h) for h in doc.get("enroll") or []),
        )


@dataclass(frozen=True)
class JobRequest:
    """A distribution job as the core sends it and the agent runs it: what to distribute
    (:class:`JobSpec`), the fleet PKI, and either a running coordinator's address or a
    coordinator to serve for the job's life.  On the wire (Dagster Pipes extras) it is
    :meth:`to_extras`; :meth:`from_extras` validates that document."""

    job: JobSpec
    pki: str
    ready_threshold: float = 0.995
    coordinator: str = ""
    serve: ServeSpec | None = None
    poll_interval_s: float = 1.0
    timeout_s: float = 3600.0
    wait_for_all: bool = False

    @classmethod
    def from_extras(cls, extras: Mapping[str, Any]) -> JobRequest:
        job = {k: v for k, v in dict(extras.get("job") or {}).items() if v is not None}
        if not job.get("model") or not job.get("version") or not job.get("manifest_uri"):
            raise JobRequestError("extras.job needs model, version and manifest_uri")
        threshold = float(job.pop("ready_threshold", 0.995))
        pki = str(extras.get("pki") or os.environ.get("RELGATE_AGENT_PKI") or "")
        if not pki:
            raise JobRequestError("extras need 'pki' (the fleet PKI directory) for mutual TLS")
        coordinator = str(extras.get("coordinator") or "")
        serve = extras.get("serve")
        if not coordinator and not serve:
            raise JobRequestError("extras need either 'coordinator' (address) or 'serve' (config)")
        return cls(
            job=JobSpec(**job, ready_threshold_ppm=round(threshold * 1_000_000)),
            pki=pki,
            ready_threshold=threshold,
            coordinator=coordinator,
            serve=ServeSpec.from_extras(serve) if not coordinator and serve else None,
            poll_interval_s=float(extras.get("poll_interval_s", 1.0)),
            timeout_s=float(extras.get("timeout_s", 3600)),
            wait_for_all=bool(extras.get("wait_for_all", False)),
        )

    def to_extras(self) -> dict[str, Any]:
        """The Pipes extras document (:meth:`from_extras` reads it back to this request)."""
        job = {k: v for k, v in self.job.to_stored().items() if k != "ready_threshold_ppm"}
        extras: dict[str, Any] = {
            "job": {**job, "ready_threshold": self.ready_threshold},
            "pki": self.pki,
            "poll_interval_s": self.poll_interval_s,
            "timeout_s": self.timeout_s,
            "wait_for_all": self.wait_for_all,
        }
        if self.coordinator:
            extras["coordinator"] = self.coordinator
        elif self.serve is not None:
            extras["serve"] = self.serve.to_extras()
        return extras
