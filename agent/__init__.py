"""The runtime-env agent: the per-node sidecar that prepares workers' runtime environments."""
