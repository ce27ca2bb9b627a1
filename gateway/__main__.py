"""``python -m gateway``: the ``clip-gateway`` command (gateway/cli/main.py)."""

import sys

from gateway.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
