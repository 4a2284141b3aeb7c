"""Command line entry point of dcu-recognize (placeholder until its issue lands)."""

import sys


def main(argv=None):
    print("dcu-recognize: not implemented yet", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
