"""The package version (kept in step with pyproject.toml; a test checks)."""

__version__ = "0.1.0"
