"""Test support, one package: real services and the builders tests share.

Services started as subprocesses and stopped by PID: ``moto_s3`` (moto's S3 server on
loopback), ``postgres`` (PostgreSQL from the installed Debian binaries), ``procs`` (free
ports, PID helpers), ``stores`` (object-store race helpers).  Builders: ``workspaces``
(a seeded workspace), ``snapshots`` (built / validated / approved / active snapshots),
``releases`` (written releases and shard tampering), ``lifecycle`` (GC fixtures).  The
pytest fixtures that use them live in ``tests/conftest.py``; ``tests/`` is on ``sys.path``,
so this package imports as ``support``.
"""
