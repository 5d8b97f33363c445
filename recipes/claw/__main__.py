"""``python -m orchard.recipes.claw run|check ...`` (see :mod:`orchard.recipes.claw.cli`)."""

import sys

from .cli import main

sys.exit(main())
