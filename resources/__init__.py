"""Dagster resources: build relgate workspaces from configuration."""

from resources.relgate import RelgateResource

__all__ = ["RelgateResource"]
