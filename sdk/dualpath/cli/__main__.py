"""``python -m dualpath.cli``: the same as the ``dualpath`` command."""

import sys

from . import main

if __name__ == "__main__":  # imported (a walk over the package's modules), it runs nothing
    sys.exit(main())
