"""User problem sources, declared in a YAML file named by ``$CRUCIBLE_SOURCES``.

Example (``sources.yaml``)::

    sources:
      - name: my_olympiad
        path: /data/olympiad.jsonl
        fields: {problem: question, answer: final_answer, solution: worked_solution}
      - name: lab_set
        path: /data/lab.parquet
        fields: {problem: text, answer: gold, choices: options, subject: topic}

Each entry becomes a partition of ``raw_problems`` (a code-location reload picks up new entries).
"""


import os
from pathlib import Path

import dagster as dg

from ops.curation.sources import BUILTIN_SOURCES, SourceError, UserSource


def load_user_sources(path: str | os.PathLike | None) -> list[UserSource]:
    """Parse a sources YAML file. No path -> no user sources.

    Raises:
        SourceError: the file is missing, not a mapping with a ``sources`` list, an entry lacks
        ``name``/``path``, or names repeat (the message names the file and the entry).
    """
    if not path:
        return []
    import yaml

    p = Path(path).expanduser()
    if not p.exists():
        raise SourceError(f"CRUCIBLE_SOURCES points to a missing file: {p}")
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise SourceError(f"{p}: not valid YAML: {e}") from e
    entries = doc.get("sources") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise SourceError(f"{p}: expected a mapping with a 'sources' list")
    out, seen = [], set()
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or "name" not in e or "path" not in e:
            raise SourceError(f"{p}: sources[{i}] needs 'name' and 'path'")
        if e["name"] in seen:
            raise SourceError(f"{p}: sources[{i}]: duplicate name {e['name']!r}")
        seen.add(e["name"])
        src_path = Path(e["path"]).expanduser()
        if not src_path.is_absolute():
            src_path = (p.parent / src_path).resolve()
        out.append(
            UserSource(
                name=e["name"],
                path=str(src_path),
                fields=dict(e.get("fields") or {"problem": "problem"}),
                max_problem_chars=int(e.get("max_problem_chars", 20_000)),
            )
        )
    return out


def configured_sources_file() -> str:
    return os.environ.get("CRUCIBLE_SOURCES", "")


def source_partition_keys(path: str | None = None) -> list[str]:
    """Built-in sources, then the user's, in file order."""
    return list(BUILTIN_SOURCES) + [s.name for s in load_user_sources(path if path is not None else configured_sources_file())]


class SourcesResource(dg.ConfigurableResource):
    """Where user sources are declared. ``config_file`` defaults to ``$CRUCIBLE_SOURCES``."""

    config_file: str = ""

    def user_sources(self) -> dict[str, UserSource]:
        return {s.name: s for s in load_user_sources(self.config_file or configured_sources_file())}
