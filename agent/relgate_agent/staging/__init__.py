"""Staging: a checkpoint version on a host's disk, from staging through placement to
retirement: staging files, journal and atomic placement (``storage``), re-verification of
a placed copy (``reverify``) and N-1 retention (``retention``)."""
