"""relgate: pinned, verified training-data snapshots and releases behind one gate."""

__version__ = "0.1.0"
