"""``python -m orchard.recipes.claw.clawbench ...`` (see :mod:`orchard.recipes.claw.clawbench.cli`)."""

import sys

from .cli import main

sys.exit(main())
