"""Broken semiring plugins, for the tests of plugin discovery (see pyproject.toml)."""
