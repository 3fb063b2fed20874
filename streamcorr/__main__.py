"""``python -m streamcorr``: the ``streamcorr`` command."""

from .cli import main

raise SystemExit(main())
