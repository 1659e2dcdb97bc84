"""Entry point of the ``sync`` mode, one process per rank, started by ``accelerate launch`` (or
torchrun) through ``resources.compute.ComputeResource``. See ``ops.gba.sync``."""

import sys

from ops.gba.sync import main

if __name__ == "__main__":
    sys.exit(main())
