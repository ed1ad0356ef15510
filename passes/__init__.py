"""qfuse passes package."""
