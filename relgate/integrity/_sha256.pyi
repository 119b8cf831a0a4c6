# Stub for the cffi-compiled kernel built from relgate/integrity/kernel_build.py.
from typing import Any

ffi: Any
lib: Any
