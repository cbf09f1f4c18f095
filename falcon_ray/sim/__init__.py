"""The simulated fleet: GKE, Compute, GCE metadata and Kubernetes APIs on loopback."""
