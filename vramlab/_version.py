"""The version of vramlab (read by pyproject.toml, the package and the CLI)."""

__version__ = "0.1.0"
