"""Tasks with verifiable answers, generated in code (no download)."""
