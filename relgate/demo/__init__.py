"""The demo: a synthetic corpus, a synthetic checkpoint and a local fleet of host agents."""
