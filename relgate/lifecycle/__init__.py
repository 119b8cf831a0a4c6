"""Dataset lifecycle: sizing, lineage, propagation, audit trail and fail-closed garbage
collection over what :mod:`relgate.holds` holds."""
