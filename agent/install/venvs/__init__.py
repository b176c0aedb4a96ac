"""Virtualenvs: one built by an installer run as a subprocess (``build``), the local files and
folders a set names (``local_read``), the root's wheel cache, and the planning of a ``uv run``
project's venv (``project_plan``)."""
