"""The package version (kept equal to ``version`` in pyproject.toml)."""
__version__ = "0.1.0"
