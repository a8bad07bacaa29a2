"""``python -m dualpath.cli``: the same as the ``dualpath`` command."""

import sys

from . import main

sys.exit(main())
