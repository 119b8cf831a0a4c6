"""A relgate workspace: configuration plus the stores and keys built from it.

Configuration lives in ``$RELGATE_HOME/relgate.json`` (written by ``relgate init``);
``RELGATE_HOME`` defaults to ``./var/relgate``.  ``RELGATE_CATALOG_URL`` overrides the
catalog database URL (e.g. PostgreSQL in production).  Nothing here is global: every
command opens its own :class:`Workspace`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from relgate.catalog.db import Database
from relgate.errors import UsageError
from relgate.gate import Gate, StoredEnvelopes
from relgate.membership import MembershipCache
from relgate.objects.base import ObjectStore
from relgate.objects.cas import ContentStore
from relgate.signing import SigningKey, TrustedKeys

CONFIG_NAME = "relgate.json"


def default_home() -> Path:
    return Path(os.environ.get("RELGATE_HOME", "var/relgate")).absolute()


def default_config(home: Path) -> dict[str, Any]:
    return {
        "catalog": {"url": f"sqlite:///{home / 'catalog.db'}"},
        "objectStore": {"kind": "local", "root": str(home / "objects")},
        "keys": {
            "signing": str(home / "keys" / "signing.pem"),
            "trusted": [str(home / "keys" / "trusted")],
        },
        "sources": [],
        "snapshot": {
            "purpose": "demo-model-training",
            "transform": "registry.local/normalize:v1",
        },
    }


def build_object_store(config: dict[str, Any]) -> ObjectStore:
    kind = config.get("kind", "local")
    if kind == "local":
        from relgate.objects.local import LocalObjectStore

        return LocalObjectStore(config["root"])
    if kind == "s3":
        from relgate.objects.s3 import S3ObjectStore

        store = S3ObjectStore(
            bucket=config["bucket"],
            prefix=config.get("prefix", ""),
            endpoint_url=config.get("endpointUrl") or os.environ.get("RELGATE_S3_ENDPOINT"),
            region=config.get("region", "us-east-1"),
        )
        return store
    raise UsageError(
        f"unknown object store kind {kind!r}", object="objectStore", check="store-kind"
    )


@dataclass
class Workspace:
    home: Path
    config: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def open(cls, home: str | os.PathLike[str] | None = None) -> Workspace:
        root = Path(home).absolute() if home is not None else default_home()
        path = root / CONFIG_NAME
        if not path.exists():
            raise UsageError(
                f"no relgate workspace at {root}; run `relgate init` first",
                object=str(path),
                check="workspace-exists",
            )
        return cls(root, json.loads(path.read_text()))

    @classmethod
    def init(
        cls, home: str | os.PathLike[str] | None = None, config: dict[str, Any] | None = None
    ) -> Workspace:
        """Create (or reopen) a workspace: config, schema migrations, dev signing keys."""
        root = Path(home).absolute() if home is not None else default_home()
        root.mkdir(parents=True, exist_ok=True)
        path = root / CONFIG_NAME
        if path.exists():
            ws = cls(root, json.loads(path.read_text()))
        else:
            ws = cls(root, config or default_config(root))
            ws.save()
        ws.db.migrate()
        ws.ensure_keys()
        return ws

    def save(self) -> None:
        path = self.home / CONFIG_NAME
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.config, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)

    def ensure_keys(self) -> None:
        signing = Path(self.config["keys"]["signing"])
        if signing.exists():
            return
        key = SigningKey.generate()
        signing.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(signing, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(key.private_pem())
        trusted = Path(self.config["keys"]["trusted"][0])
        trusted.mkdir(parents=True, exist_ok=True)
        (trusted / f"{key.keyid.removeprefix('sha256:')[:16]}.pem").write_bytes(key.public_pem())

    # -- components ------------------------------------------------------------------------
    @cached_property
    def db(self) -> Database:
        url = os.environ.get("RELGATE_CATALOG_URL") or self.config["catalog"]["url"]
        return Database(url)

    @cached_property
    def store(self) -> ObjectStore:
        return build_object_store(self.config["objectStore"])

    @cached_property
    def cas(self) -> ContentStore:
        return ContentStore(self.store)

    @cached_property
    def signing_key(self) -> SigningKey:
        return SigningKey.load(self.config["keys"]["signing"])

    @cached_property
    def trusted_keys(self) -> TrustedKeys:
        return TrustedKeys.load(self.config["keys"]["trusted"])

    @cached_property
    def membership(self) -> MembershipCache:
        return MembershipCache(self.cas, self.home / "cache" / "membership")

    def gate(self) -> Gate:
        """The gate over this workspace's catalog; fence advances close hit permits."""
        from relgate.members_index import CatalogMemberIndex
        from relgate.permits import close_hit_permits

        envelopes = StoredEnvelopes(self.store, self.trusted_keys)
        gate = Gate(self.db, CatalogMemberIndex(self.membership), envelopes=envelopes)
        gate.listeners.append(close_hit_permits)
        return gate

    def close(self) -> None:
        if "db" in self.__dict__:
            self.db.dispose()
