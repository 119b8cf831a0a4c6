"""One exception hierarchy for the core.

Every error carries an exit code (DESIGN.md: 0 ok, 1 internal, 2 usage, 3 rejected,
4 conflict) and names the object, the check that failed and the digest involved, so the
CLI and Dagster layers can report it without knowing the details.  Messages never carry
sample text.
"""

from __future__ import annotations

from typing import Any


class RelgateError(Exception):
    exit_code = 1
    code = "internal"

    def __init__(
        self,
        message: str,
        *,
        object: str | None = None,
        check: str | None = None,
        digest: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.object = object
        self.check = check
        self.digest = digest
        self.details = details or {}

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.code, "message": self.message}
        for name in ("object", "check", "digest"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.details:
            out["details"] = self.details
        return out

    def __str__(self) -> str:
        parts = [self.message]
        if self.object:
            parts.append(f"object={self.object}")
        if self.check:
            parts.append(f"check={self.check}")
        if self.digest:
            parts.append(f"digest={self.digest}")
        return " ".join(parts)


class UsageError(RelgateError):
    exit_code = 2
    code = "usage"


class NotFoundError(RelgateError):
    exit_code = 3
    code = "not_found"


class RejectedError(RelgateError):
    """Validation, verification or a gate refusal: the input is wrong, nothing changed."""

    exit_code = 3
    code = "rejected"


class IntegrityError(RejectedError):
    """Bytes or a manifest do not match the digest or signature that vouches for them."""

    code = "integrity"


class ConflictError(RelgateError):
    """Lost a compare-and-swap or named a stale generation; retry with fresh state."""

    exit_code = 4
    code = "conflict"


class ObjectExistsError(ConflictError):
    code = "object_exists"
