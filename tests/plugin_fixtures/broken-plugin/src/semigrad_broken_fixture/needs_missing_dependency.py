"""A plugin module whose import fails: it needs a package that is not installed."""

import semigrad_fixture_dependency_that_is_not_installed  # noqa: F401

AnySemiring = None
