"""Fixtures every test module may use: the session's real local Ray cluster (tests/localray.py)."""

from tests.localray import cluster, local_cluster, ops_env  # noqa: F401
