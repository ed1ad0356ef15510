"""qfuse runtime package."""
