"""pytest's configuration of the tests.

``--doctest-modules`` (pyproject.toml) imports every module under ``tests/`` to
collect its doctests; a worker script that a test starts as a process of its own,
and that reads its command line and joins a process group when imported, is not
such a module.
"""

collect_ignore = ["fsdp_worker.py"]
