"""The errors of the shared trust code: a manifest or signature that does not verify, a
path or name that is unsafe, a job request that does not parse.

The agent's error hierarchy is rooted here (``relgate_agent.errors.AgentError`` is
:class:`TrustError`), so a refusal raised by this package is an agent error where the
agent runs it; the core translates these into its own refusals at its boundary.
"""

from __future__ import annotations


class TrustError(Exception):
    """Base class of every error raised by relgate-trust (and, by that name, the agent)."""


class ManifestError(TrustError):
    """A checkpoint manifest is malformed, names something unsafe, or does not match its bytes."""


class VerificationError(ManifestError):
    """A signed manifest failed verification (unsigned, unknown key, bad signature, tampered)."""


class JobRequestError(TrustError):
    """A distribution job request (the Pipes extras) is missing what the job needs."""
