"""Dagster assets and asset checks, grouped by domain; thin wrappers over relgate."""
