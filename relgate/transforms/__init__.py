"""Pinned transforms: wheels and OCI images, verified, unpacked and run as subprocesses."""
