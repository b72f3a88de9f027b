"""clusterbot's chat side: the shared-cluster protocol engine and its chat adapters (Discord, terminal)."""
