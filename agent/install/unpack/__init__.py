"""Unpacking: safe zip extraction (``archive``: plan, shares, write, finish) and the pool of
worker processes that runs it, also while its download goes on (``overlap``). Imported by the
workers, which run without site: this package's modules import only the standard library and
the agent's own modules."""
