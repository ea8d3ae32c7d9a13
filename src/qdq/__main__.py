"""``python -m qdq`` runs the ``qdq`` command."""

from qdq.cli.main import main

raise SystemExit(main())
