"""`python -m noduslocal.daemon`: noduslocald."""

from __future__ import annotations

import sys

from noduslocal.daemon.main import main

sys.exit(main())
