"""Data plane: how checkpoint bytes move. Reads from the origin (``origin``, ``rangefetch``,
bounded manifest reads in ``manifestread``), peer streams over framed mutual TLS
(``transport``, with ``wan`` frames on cross-DC links) and the byte-rate limits (``pacing``)."""
