"""`python -m noduslocal.cli`."""

from __future__ import annotations

from noduslocal.cli.main import main

main()
