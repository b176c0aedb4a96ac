"""State: the store of installed packages (single-flight installs, the LRU under a budget), its
durable index (state.db) and the recovery that makes the two agree at start."""
