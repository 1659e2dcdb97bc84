"""Reading the project's YAML configuration files (the production profile, user sources) with one
set of error messages: the message names the environment variable that pointed at the file, or the
file itself."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def read_yaml_mapping(path: str | os.PathLike, error: type[Exception], env_var: str) -> tuple[Path, dict[str, Any]]:
    """Parse the YAML file at ``path`` into a mapping.

    Args:
        path: the file (``~`` expanded).
        error: the exception class raised on a bad file (e.g. ``ProfileError``, ``SourceError``).
        env_var: the environment variable that names the file, for the missing-file message.
    Returns:
        (the expanded path, the document; an empty file gives ``{}``).
    Raises:
        error: the file is missing, is not valid YAML, or its top level is not a mapping.
    """
    import yaml

    p = Path(path).expanduser()
    if not p.exists():
        raise error(f"{env_var} points to a missing file: {p}")
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise error(f"{p}: not valid YAML: {e}") from e
    if not isinstance(doc, dict):
        raise error(f"{p}: expected a mapping at the top level, got {type(doc).__name__}")
    return p, doc
