"""A relgate workspace: its validated configuration plus the stores and keys built from it.

Configuration lives in ``$RELGATE_HOME/relgate.json`` (written by ``relgate init``) and is
validated into :class:`WorkspaceConfig` when it is read; ``RELGATE_HOME`` defaults to
``./var/relgate``.  ``RELGATE_CATALOG_URL`` overrides the catalog database URL (e.g.
PostgreSQL in production).  Nothing here is global: every command opens its own
:class:`Workspace` (:func:`relgate.gate.transitions.open_gate` builds the gate over it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Self

from pydantic import Field, JsonValue, model_validator
from relgate_trust.digests import sha256_digest
from relgate_trust.dsse import REVOKED_FILE, key_filename, revoked_bytes

from relgate.catalog.db import Database
from relgate.catalog.events import GateOperation, Outcome, record
from relgate.documents.declared_readers import ReaderSpec
from relgate.documents.membership import MembershipCache
from relgate.errors import ConflictError, RejectedError, UsageError
from relgate.integrity.contract import Contract, JsonObject
from relgate.integrity.signing import Role, SigningKey, TrustedKey, TrustedKeys, load_trusted
from relgate.objects.cas import ContentStore, StorageFault
from relgate.objects.local import LocalObjectStore
from relgate.objects.versioned import ObjectStore

CONFIG_NAME = "relgate.json"
#: Where local caches go when set (see :attr:`Workspace.cache_dir`).
CACHE_ENV = "RELGATE_CACHE_DIR"
_log = logging.getLogger(__name__)
#: A ``relgate.json`` that cannot be read or decoded.
CONFIG_CHECK = "workspace-config"
#: ``sha256:`` plus at least 8 hex digits names a key by prefix.
_MIN_KEYID_PREFIX = 15


class CatalogConfig(Contract):
    """Where the catalog database is (overridden by ``RELGATE_CATALOG_URL``)."""

    url: str


class ObjectStoreConfig(Contract):
    """The object store: a local directory or an S3 bucket (with an optional key prefix)."""

    kind: str = "local"
    root: str | None = None
    bucket: str | None = None
    prefix: str = ""
    endpoint_url: str | None = None
    region: str = "us-east-1"


class RoleKeyConfig(Contract):
    """One role's current private key file and its version."""

    path: str
    version: int


class KeysConfig(Contract):
    """Signing keys: the builder's (``signing``), trusted public-key dirs, keys per role."""

    signing: str
    trusted: list[str] = Field(min_length=1)
    roles: dict[str, RoleKeyConfig] | None = None


class WorkspaceConfig(Contract):
    """``relgate.json``, validated.  ``sources`` and ``snapshot`` are validated by their
    owners (:mod:`relgate.sources`, :class:`relgate.snapshot.build.BuildSpec`)."""

    catalog: CatalogConfig
    object_store: ObjectStoreConfig
    keys: KeysConfig
    sources: list[dict[str, JsonValue]] = Field(default_factory=list)
    snapshot: dict[str, JsonValue] = Field(default_factory=dict)
    #: declared readers of releases (:mod:`relgate.documents.declared_readers`); absent when none
    readers: tuple[ReaderSpec, ...] | None = None

    @model_validator(mode="after")
    def _reader_names_once(self) -> Self:
        names = [r.name for r in self.readers or ()]
        if len(set(names)) != len(names):
            raise ValueError("two readers share a name")
        return self


def _private_dir(path: Path) -> Path:
    """``path`` as a directory only this user can write (created 0700): in a shared temp
    dir another user could have put a symlink or an open directory there first."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise RejectedError(
            "the cache directory is not a private directory of this user (a symlink, another"
            f" owner, or writable by others): set {CACHE_ENV}",
            object=str(path),
            check="cache-dir",
        )
    return path


def default_home() -> Path:
    return Path(os.environ.get("RELGATE_HOME", "var/relgate")).absolute()


def default_settings(home: Path) -> WorkspaceConfig:
    """The configuration ``relgate init`` writes for a fresh workspace at ``home``."""
    return WorkspaceConfig(
        catalog=CatalogConfig(url=f"sqlite:///{home / 'catalog.db'}"),
        object_store=ObjectStoreConfig(kind="local", root=str(home / "objects")),
        keys=KeysConfig(
            signing=str(home / "keys" / "builder-v1.pem"),
            trusted=[str(home / "keys" / "trusted")],
        ),
        sources=[],
        snapshot={"purpose": "demo-model-training", "transform": "registry.local/normalize:v1"},
    )


def default_config(home: Path) -> JsonObject:
    """:func:`default_settings` as the JSON document stored in ``relgate.json``."""
    return _document(default_settings(home))


def _document(settings: WorkspaceConfig) -> JsonObject:
    doc: JsonObject = settings.to_json(exclude_none=True)
    store = doc["objectStore"]
    if isinstance(store, dict) and store.get("kind") == "local":
        store.pop("prefix", None)
        store.pop("region", None)
    return doc


def parse_config(document: object, *, where: str = CONFIG_NAME) -> WorkspaceConfig:
    """Validate a decoded ``relgate.json`` (RejectedError check=schema if it is not one)."""
    return WorkspaceConfig.parse(document, what=where)


def read_config(path: Path) -> dict[str, Any]:
    """The decoded ``relgate.json`` at ``path``: an unreadable file, or one that is not a JSON
    object, is refused naming the file (exit 3, ``check=workspace-config``)."""
    try:
        document = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as exc:
        raise RejectedError(
            f"the workspace config is not a readable JSON document: {exc}",
            object=str(path),
            check=CONFIG_CHECK,
        ) from None
    if not isinstance(document, dict):
        raise RejectedError(
            "the workspace config is not a JSON object", object=str(path), check=CONFIG_CHECK
        )
    return document


def build_object_store(config: ObjectStoreConfig | Mapping[str, object]) -> ObjectStore:
    """The object store a configuration names (a raw ``objectStore`` mapping is validated)."""
    cfg = (
        config
        if isinstance(config, ObjectStoreConfig)
        else ObjectStoreConfig.parse(dict(config), what="objectStore")
    )
    if cfg.kind == "local" and cfg.root is not None:
        return LocalObjectStore(cfg.root)
    if cfg.kind == "s3" and cfg.bucket is not None:
        # boto3 costs ~0.1 s of import; a workspace on the embedded store never pays it
        from relgate.objects.s3 import S3ObjectStore  # noqa: PLC0415 - see above

        return S3ObjectStore(
            bucket=cfg.bucket,
            prefix=cfg.prefix,
            endpoint_url=cfg.endpoint_url or os.environ.get("RELGATE_S3_ENDPOINT"),
            region=cfg.region,
        )
    raise UsageError(
        f"unknown object store kind {cfg.kind!r}", object="objectStore", check="store-kind"
    )


@dataclass
class Workspace:
    """One workspace: ``config`` is the ``relgate.json`` document (what is saved),
    :attr:`settings` its validated model (what the stores and keys are built from)."""

    home: Path
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def settings(self) -> WorkspaceConfig:
        """The configuration, validated (re-read, so edits to ``config`` are seen)."""
        return parse_config(self.config, where=str(self.home / CONFIG_NAME))

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
        ws = cls(root, read_config(path))
        parse_config(ws.config, where=str(path))
        return ws

    @classmethod
    def init(
        cls,
        home: str | os.PathLike[str] | None = None,
        config: Mapping[str, object] | WorkspaceConfig | None = None,
    ) -> Workspace:
        """Create (or reopen) a workspace: config, schema migrations, dev signing keys."""
        root = Path(home).absolute() if home is not None else default_home()
        root.mkdir(parents=True, exist_ok=True)
        path = root / CONFIG_NAME
        if path.exists():
            ws = cls(root, read_config(path))
        else:
            if isinstance(config, WorkspaceConfig):
                document: dict[str, Any] = _document(config)
            elif config:
                document = config if isinstance(config, dict) else dict(config)
            else:
                document = default_config(root)
            ws = cls(root, document)
            ws.save()
        db = ws.__dict__["db"] = Database(ws.catalog_url)  # not yet migrated: unchecked
        db.migrate()
        ws.ensure_keys()
        return ws

    def save(self) -> None:
        """Validate and write ``relgate.json`` atomically."""
        path = self.home / CONFIG_NAME
        parse_config(self.config, where=str(path))
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.config, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)

    # -- keys ------------------------------------------------------------------------------
    # One Ed25519 key per role (builder, verifier, approver, gate), each with a version.
    # Private keys: keys/<role>-v<N>.pem (0600); public keys: <trusted dir>/<role>-v<N>-<kid>.pem
    # (the file name carries role and version, see relgate_trust.dsse); config keys.roles
    # records each role's current {path, version}; keys.signing mirrors the builder's and
    # names the directory role keys are written to.  Revocations: <trusted>/revoked.json.

    @property
    def trusted_dir(self) -> Path:
        return Path(self.settings.keys.trusted[0])

    def _write_role_key(self, role: Role, version: int) -> SigningKey:
        key = SigningKey.generate(role, version)
        private = Path(self.config["keys"]["signing"]).parent / f"{role.value}-v{version}.pem"
        private.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise ConflictError(
                f"{role.value} key v{version} already exists (a concurrent rotation?); retry",
                object=str(private),
                check="key-version",
            ) from None
        with os.fdopen(fd, "wb") as fh:
            fh.write(key.private_pem())
        self.trusted_dir.mkdir(parents=True, exist_ok=True)
        (self.trusted_dir / key_filename(role, version, key.keyid)).write_bytes(key.public_pem())
        self.config["keys"].setdefault("roles", {})[role.value] = {
            "path": str(private),
            "version": version,
        }
        if role is Role.BUILDER:
            self.config["keys"]["signing"] = str(private)
        return key

    def ensure_keys(self) -> None:
        keys = self.config["keys"]
        roles = keys.setdefault("roles", {})
        for role in Role:
            if role.value not in roles:
                self._write_role_key(role, 1)
        self.save()
        self.__dict__.pop("trusted_keys", None)

    def key(self, role: Role | str) -> SigningKey:
        """The current signing key of ``role``."""
        role = Role(role)
        keys = self.settings.keys
        entry = (keys.roles or {}).get(role.value)
        if entry is None:
            raise UsageError(
                f"this workspace has no {role.value} key; run `relgate init` to create role keys",
                object="keys",
                check="key-missing",
            )
        return SigningKey.load(entry.path, role, entry.version)

    def rotate_key(self, role: Role | str) -> SigningKey:
        """Add a new version of ``role``'s key and sign with it from now on; old ones still verify."""
        role = Role(role)
        self.ensure_keys()
        versions = [k.version for k in self.trusted_keys.keys.values() if k.role is role]
        current = (self.settings.keys.roles or {})[role.value].version
        key = self._write_role_key(role, max([current, *versions]) + 1)
        self.save()
        self.__dict__.pop("trusted_keys", None)
        self.__dict__.pop("signing_key", None)
        return key

    def revoke_key(self, keyid: str) -> TrustedKey:
        """Refuse signatures by ``keyid`` (a full keyid or a unique hex prefix) from now on."""
        trusted = self.trusted_keys
        wanted = keyid if keyid.startswith("sha256:") else f"sha256:{keyid}"
        matches = [
            k for k in trusted.keys if k.startswith(wanted) and len(wanted) >= _MIN_KEYID_PREFIX
        ]
        if len(matches) != 1:
            raise UsageError(
                f"{len(matches)} trusted keys match {keyid!r}; give a full keyid",
                object=keyid,
                check="keyid",
            )
        found = trusted.keys[matches[0]]
        for entry in (self.settings.keys.roles or {}).values():
            if SigningKey.load(entry.path).keyid == found.keyid:
                raise RejectedError(
                    f"{found.keyid} is the current {found.role} key; rotate it first",
                    object=found.keyid,
                    check="key-current",
                    digest=found.keyid,
                )
        path = self.trusted_dir / REVOKED_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(revoked_bytes(trusted.revoked | {found.keyid}))
        os.replace(tmp, path)
        self.__dict__.pop("trusted_keys", None)
        return found

    # -- components ------------------------------------------------------------------------
    @property
    def catalog_url(self) -> str:
        """``RELGATE_CATALOG_URL`` when set, else the config's catalog URL."""
        return os.environ.get("RELGATE_CATALOG_URL") or self.settings.catalog.url

    @cached_property
    def db(self) -> Database:
        """The catalog, refused (``catalog-schema``) when it holds no relgate schema: a
        workspace created with ``RELGATE_CATALOG_URL`` set, then used without it."""
        db = Database(self.catalog_url)
        db.require_schema()
        return db

    @cached_property
    def store(self) -> ObjectStore:
        return build_object_store(self.settings.object_store)

    @cached_property
    def cas(self) -> ContentStore:
        return ContentStore(self.store, on_fault=self._record_storage_fault)

    def _record_storage_fault(self, fault: StorageFault) -> None:
        """A stored CAS version failed its digest and the builder wrote a new version of the
        same content: recorded as a ``storage-repair`` gate event (and logged)."""
        _log.warning(
            "stored object %s@%s failed %s (expected %s, actual %s); repaired as version %s",
            fault.key,
            fault.version,
            fault.check,
            fault.expected,
            fault.actual,
            fault.repaired_version,
        )
        with self.db.tx() as conn:
            record(
                conn,
                GateOperation.STORAGE_REPAIR,
                Outcome.OK,
                subject=f"{fault.key}@{fault.version} actual={fault.actual}"
                f" repaired={fault.repaired_version}",
                digest=fault.expected,
                check=fault.check,
            )

    @cached_property
    def signing_key(self) -> SigningKey:
        """The builder's current key (snapshot manifests, release roots, checkpoints)."""
        return self.key(Role.BUILDER)

    @cached_property
    def trusted_keys(self) -> TrustedKeys:
        return load_trusted(self.settings.keys.trusted)

    @cached_property
    def cache_dir(self) -> Path:
        """Where local caches of stored, digest-checked bytes go: ``$RELGATE_CACHE_DIR``
        when set, else ``<home>/cache`` when the workspace directory is writable, else a
        per-user directory under the system temp dir (a read-only workspace mount)."""
        chosen = os.environ.get(CACHE_ENV)
        if chosen:
            return Path(chosen).absolute()
        if os.access(self.home, os.W_OK):
            return self.home / "cache"
        tag = sha256_digest(str(self.home).encode()).removeprefix("sha256:")[:16]
        return _private_dir(Path(tempfile.gettempdir()) / f"relgate-cache-{os.getuid()}") / tag

    @cached_property
    def membership(self) -> MembershipCache:
        return MembershipCache(self.cas, self.cache_dir / "membership")

    def close(self) -> None:
        if "db" in self.__dict__:
            self.db.dispose()
