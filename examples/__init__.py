"""qfuse examples package."""
