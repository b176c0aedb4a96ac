"""The parts the tests share, one concept a module: what a test file needs from another lives here,
never in a ``test_*.py`` file (``tests/test_harness_imports.py`` holds that), and the pytest
plugins the suite loads (``tests/conftest.py``)."""
