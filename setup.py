"""Only what pyproject.toml cannot say: the cffi-built native hashing kernel."""

from setuptools import setup

setup(cffi_modules=["relgate/integrity/kernel_build.py:ffibuilder"])
