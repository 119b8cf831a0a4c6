"""Host agent: job runner (stripe workers, journal, placement) and the per-host daemon."""
