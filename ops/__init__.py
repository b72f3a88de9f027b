"""clusterbot's ops library: Ray and GCP operations on the shared clusters, with no knowledge of chat."""
