"""Google Cloud APIs as ops uses them, one module per API, with clients passed in (real, or the
simulator's on 127.0.0.1, as the registry says)."""
