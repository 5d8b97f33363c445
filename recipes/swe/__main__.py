"""``python -m orchard.recipes.swe run ...`` (see :mod:`orchard.recipes.swe.cli`)."""

import sys

from .cli import main

sys.exit(main())
