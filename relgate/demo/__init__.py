"""The demo: a synthetic corpus in all three source kinds, a demo checkpoint, a local fleet."""
