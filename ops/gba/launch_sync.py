"""Entry point of the ``sync`` mode, run as a module on every rank by ``accelerate launch -m`` (or
``torchrun -m``): ``ops.gba.launch_sync --spec SPEC --out DIR [--fingerprint FP]``, started through
``resources.compute.ComputeResource``. See ``ops.gba.sync``."""

import sys

from ops.gba.sync import main

if __name__ == "__main__":
    sys.exit(main())
