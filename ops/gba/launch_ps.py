"""Entry point of the parameter-server modes (async, ssp, hopbw, gba): rank 0 by default, a worker
with ``--role worker``. See ``ops.gba.ps``."""

import sys

from ops.gba.ps import main

if __name__ == "__main__":
    sys.exit(main())
