"""Dataset snapshots: freeze, build, validate, approve, activate, diff, replay, prove."""
