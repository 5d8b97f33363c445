"""``python -m orchard.recipes.claw.generator ...`` (see :mod:`orchard.recipes.claw.generator.cli`)."""

import sys

from .cli import main

sys.exit(main())
