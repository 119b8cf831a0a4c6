"""Host agent: the per-host daemon (``host``) and one job on it (``runner``, over the shared
``job`` state: ``stripes`` workers, chunk ``repair``, the ``control`` loops and journal)."""
