"""The simulated scheduler: a worker pool that counts runtime-env ids (built in a later issue)."""
