"""``dualpath``: the command line. Builds a config, calls the public API, prints.

One module per job: ``parser`` (every subcommand and its options), ``common`` (the config,
sampling and model path built from the arguments), and one per subcommand family."""

from __future__ import annotations

import logging
import sys

from .parser import build_parser

__all__ = ["build_parser", "main"]


def main(argv=None) -> int:
    from ..errors import DualPathError

    args = build_parser().parse_args(argv)
    verbose = args.verbose or getattr(args, "load_report", False)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except DualPathError as e:
        print(f"dualpath: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
