"""``python -m clip_gateway``: the ``clip-gateway`` command (clip_gateway/cli/main.py)."""

import sys

from clip_gateway.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
