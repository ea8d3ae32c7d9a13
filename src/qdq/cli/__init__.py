"""The ``qdq`` command line."""
