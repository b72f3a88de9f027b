"""Fixtures every test module may use: the session's real local Ray cluster (tests/localray.py), and
fake-gcs-server with stores on both backends (tests/gcs_emulator.py)."""

from tests.gcs_emulator import gcs_bucket, gcs_server, make_store, store  # noqa: F401
from tests.localray import cluster, local_cluster, ops_env, stalled  # noqa: F401
