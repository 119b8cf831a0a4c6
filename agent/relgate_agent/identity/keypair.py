"""``relgate-agent keygen``: create a manifest-signing key pair, atomically and rerunnably.

The public key is a *builder* key: checkpoint manifests verify only under a trusted key whose
file name gives it a role that may sign them (``builder-v<N>[-<anything>].pem``, see
:mod:`relgate_trust.dsse`).  :func:`public_key_path` turns ``--public`` into that file: a
directory (an existing one, or a path ending in ``/``) gets ``builder-v1.pem`` in it; a file
must be named for the builder role; any other name is refused before anything is written
(:class:`PublicKeyNameError`, a usage error).

Both files are written to a temporary file in their directory and renamed into place
(parent directories are created), the public key first and the private key last: the
private key is the commit point. So a crash leaves no pair, an orphan public key (replaced
by the rerun), or a whole pair; never a torn file.

A rerun decides from what it finds at ``--private``:

* nothing, an empty file, or a torn PEM block (what an older, non-atomic keygen left when it
  crashed) -> a new pair is written;
* an Ed25519 private key whose public key is missing or unreadable -> the public key is
  written from it (the pair is completed; no new key, so nothing signed is invalidated);
* a complete pair -> refused (exit 3, check ``key-exists``, naming the file and the keyid):
  replacing a signing key is a rotation, asked for with ``--force``;
* a public key of another key at ``--public`` (check ``public-key-mismatch``) or anything
  else at ``--private`` (check ``not-ed25519-private-key``) -> refused, untouched.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from relgate_trust import dsse
from relgate_trust.fstree import write_file_atomic
from relgate_trust.manifest import generate_private_key, keyid_for, public_key_pem, write_keypair

from relgate_agent.errors import AgentError

CHECK_KEY_EXISTS = "key-exists"
CHECK_PUBLIC_MISMATCH = "public-key-mismatch"
CHECK_NOT_ED25519 = "not-ed25519-private-key"
CHECK_PUBLIC_NAME = "public-key-name"
_PEM_BEGIN = b"-----BEGIN PRIVATE KEY-----"
_PEM_END = b"-----END PRIVATE KEY-----"
_MAX_KEY_FILE = 64 * 1024  # a PEM Ed25519 key is ~120 bytes; never read more than this


#: The role of the keys keygen writes: the one that signs checkpoint manifests.
SIGNING_ROLE = dsse.Role.BUILDER
#: The public key file keygen writes into a directory given as ``--public``.
DEFAULT_PUBLIC_NAME = f"{SIGNING_ROLE.value}-v1.pem"
ROLED_PATTERN = f"{SIGNING_ROLE.value}-v<N>[-<anything>].pem"


class KeyPairError(AgentError):
    """keygen refused: the file it names holds something it will not replace."""

    def __init__(self, message: str, *, check: str, path: Path, keyid: str = "") -> None:
        super().__init__(message)
        self.check, self.path, self.keyid = check, path, keyid


class PublicKeyNameError(KeyPairError):
    """``--public`` names a file the key would not verify under (no builder role): the CLI
    makes it a usage error (exit 2), before anything is read or written."""

    def __init__(self, message: str, *, path: Path) -> None:
        super().__init__(message, check=CHECK_PUBLIC_NAME, path=path)


def public_key_path(given: str) -> Path:
    """Where keygen writes the public key for ``--public given`` (see the module doc)."""
    path = Path(given)
    if given.endswith(("/", os.sep)) or path.is_dir():
        return path / DEFAULT_PUBLIC_NAME
    role, _version = dsse.role_of_filename(path.name)
    if role is SIGNING_ROLE:
        return path
    why = (
        f"a {role.value} key may not sign checkpoint manifests"
        if role is not None
        else "a trusted key not named for its role is refused for every document (key-role)"
    )
    raise PublicKeyNameError(
        path=path,
        message=f"{given!r}: the public key file must be named {ROLED_PATTERN} (e.g. "
        f"{DEFAULT_PUBLIC_NAME}) or be a directory (then {DEFAULT_PUBLIC_NAME} is written in "
        f"it); {why}",
    )


@dataclass(frozen=True)
class KeyPairOutcome:
    keyid: str
    private: Path
    public: Path
    created: bool  # False: an existing private key's public half was (re)written

    def to_json(self) -> dict[str, object]:
        return {
            "keyid": self.keyid,
            "private": str(self.private),
            "public": str(self.public),
            "created": self.created,
        }


def _read_bounded(path: Path) -> bytes | None:
    try:
        with path.open("rb") as fh:
            return fh.read(_MAX_KEY_FILE + 1)
    except FileNotFoundError:
        return None


def _existing_private(path: Path) -> Ed25519PrivateKey | None:
    """The Ed25519 key at ``path``; None when there is none or only a crashed write."""
    data = _read_bounded(path)
    if data is None or not data.strip():
        return None
    head = data.lstrip()
    if head.startswith(_PEM_BEGIN[: len(head)]) and _PEM_END not in head:
        return None  # a torn PEM block
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyPairError(
            f"{path} is not an Ed25519 private key (check {CHECK_NOT_ED25519}); not replaced",
            check=CHECK_NOT_ED25519,
            path=path,
        ) from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyPairError(
            f"{path} holds a {type(key).__name__}, not an Ed25519 private key "
            f"(check {CHECK_NOT_ED25519}); not replaced",
            check=CHECK_NOT_ED25519,
            path=path,
        )
    return key


def _existing_public(path: Path) -> Ed25519PublicKey | None:
    data = _read_bounded(path)
    if not data:
        return None
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError):
        return None  # torn or unreadable: rewritten from the private key
    return key if isinstance(key, Ed25519PublicKey) else None


def create_keypair(private: Path, public: Path, *, force: bool = False) -> KeyPairOutcome:
    """Write a new pair, complete a half-written one, or refuse (see the module doc).

    ``public`` is the file itself (:func:`public_key_path` of ``--public``); a name that is
    not a builder key's is refused before anything is read or written."""
    if dsse.role_of_filename(public.name)[0] is not SIGNING_ROLE:
        raise PublicKeyNameError(
            f"{public}: the public key file must be named {ROLED_PATTERN}", path=public
        )
    existing = None if force else _existing_private(private)
    if existing is None:
        key = generate_private_key()
        write_keypair(key, private, public)
        return KeyPairOutcome(keyid_for(key.public_key()), private, public, created=True)
    keyid = keyid_for(existing.public_key())
    held = _existing_public(public)
    if held is None:
        write_file_atomic(public, public_key_pem(existing.public_key()), 0o644)
        return KeyPairOutcome(keyid, private, public, created=False)
    if keyid_for(held) == keyid:
        raise KeyPairError(
            f"{private} already holds Ed25519 key {keyid} with its public key at {public} "
            f"(check {CHECK_KEY_EXISTS}); pass --force to replace the pair",
            check=CHECK_KEY_EXISTS,
            path=private,
            keyid=keyid,
        )
    raise KeyPairError(
        f"{public} holds public key {keyid_for(held)}, not {keyid} of {private} "
        f"(check {CHECK_PUBLIC_MISMATCH}); pass --force to replace the pair",
        check=CHECK_PUBLIC_MISMATCH,
        path=public,
        keyid=keyid_for(held),
    )
