"""State: the store of installed packages (single-flight installs; eviction least recently used
first under a budget, by the passes over the index), its durable index (state.db, whose SQL is
``schema``'s) and the recovery that makes the two agree at start."""
