"""Entry point of the ``sync`` mode, run as a module on every rank by ``accelerate launch -m`` (or
``torchrun -m``): ``ops.gba.launch_sync --spec SPEC --out DIR [--fingerprint FP]``, started through
``resources.compute.ComputeResource``. See ``ops.gba.sync``."""

from ops.gba.sync import main
from ops.launch import exit_worker

if __name__ == "__main__":
    exit_worker(main())
