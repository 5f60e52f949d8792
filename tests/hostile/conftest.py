"""Fixtures of the hostile-input suite (a served dgxmm, shared by each module)."""

from hostile.harness import front  # noqa: F401 (a fixture)
