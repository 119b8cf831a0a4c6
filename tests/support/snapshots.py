from relgate.catalog.snapshot_table import get_snapshot
from relgate.snapshot import activation as lifecycle
from relgate.snapshot.build import BuildSpec, build_snapshot
from relgate.snapshot.validate import validate_snapshot


def build(ws, **overrides):
    spec = BuildSpec.from_config(ws.config)
    for key, value in overrides.items():
        setattr(spec, key, value)
    return build_snapshot(ws, spec, actor="test")


def build_validated(ws, **overrides):
    result = build(ws, **overrides)
    report = validate_snapshot(ws, result.digest, actor="test")
    assert report.outcome == "VALIDATED", (report.checks, report.problems)
    return result


def build_approved(ws, **overrides):
    """A validated snapshot a person approved: what a release may be cut from."""
    result = build_validated(ws, **overrides)
    lifecycle.approve(ws, result.digest, approver="alice")
    return result


def build_active(ws, alias="default"):
    result = build_validated(ws)
    lifecycle.approve(ws, result.digest, approver="alice")
    lifecycle.activate(ws, result.digest, alias=alias, actor="alice")
    return result


def state_of(ws, digest):

    return get_snapshot(ws.db, digest).state
