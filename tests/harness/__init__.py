"""Test harness: real services started as subprocesses and stopped by PID.

``moto_s3`` runs moto's S3 server on loopback, ``postgres`` runs PostgreSQL from the
installed Debian binaries, ``ports`` picks free loopback ports.  The pytest fixtures that
use them live in ``tests/conftest.py``.
"""
