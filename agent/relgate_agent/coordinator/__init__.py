"""Coordinator: topology planning, durable job state, progress cache and deployer handoff."""
