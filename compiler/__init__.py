"""qfuse compiler package."""
