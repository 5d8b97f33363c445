"""``python -m orchard.recipes.gui``: see :mod:`orchard.recipes.gui.cli`."""

import sys

from .cli import main

sys.exit(main())
