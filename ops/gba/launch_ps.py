"""Entry point of the parameter-server modes (async, ssp, hopbw, gba), run as a module:
``python -m ops.gba.launch_ps --spec SPEC --out DIR [--fingerprint FP]`` is rank 0 (the PS);
``--role worker`` a worker. See ``ops.gba.ps``."""

import sys

from ops.gba.ps import main

if __name__ == "__main__":
    sys.exit(main())
