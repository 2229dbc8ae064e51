"""``python -m autom`` is the ``autom`` command."""

from autom.cli import main

raise SystemExit(main())
