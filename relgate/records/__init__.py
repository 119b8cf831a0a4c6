"""Records: the declared schema of a corpus's records, their canonical value bytes, the
content digest, token counts and typed rows from JSON sources."""
