"""The pure core: values and tables with no I/O and no asyncio (URIs, runtime envs, the
reference tables, the worker context, errors, units). Everything else builds on it."""
