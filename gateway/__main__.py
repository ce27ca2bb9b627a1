"""``python -m gateway``: the ``clip-gateway`` command (client commands, and ``serve``)."""

import sys

from gateway.client.cli import main

if __name__ == "__main__":
    sys.exit(main())
