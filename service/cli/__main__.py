"""``python -m service.cli``: the same as the ``retrieval-monitor`` command."""

from service.cli.main import main

raise SystemExit(main())
