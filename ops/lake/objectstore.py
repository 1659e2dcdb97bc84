"""Object-store roots (s3://..., any fsspec URL): no rename, so a commit is "objects, then manifest".
docs/operations.md, "Lake on object storage".
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ops.lake.atomic import file_sha256
from ops.lake.errors import LakeConflictError, _precondition_failed

if TYPE_CHECKING:
    import polars as pl

MANIFEST_FORMAT = "crucible-lake-manifest/1"


def is_object_store(root: str | Path) -> bool:
    """True for a URL root with a scheme other than ``file`` (``s3://bucket/prefix``, ``gs://...``,
    ``memory://...``); plain paths and ``file://`` URLs are local and keep the rename commit."""
    text = str(root)
    return "://" in text and not text.startswith("file://")


class ObjectStoreLake:
    """Versioned objects plus a manifest commit on an fsspec filesystem (S3 and S3-compatible
    servers, GCS, ``memory://`` in tests). Object stores cannot rename, so a *key* (a table
    ``annotated_problems/data.parquet``, a JSON file, a directory such as ``sft_dataset``) is
    committed in two steps:

    1. every file of the new version is uploaded under a version-unique prefix
       ``<root>/<parent>/_v/<basename>/<id>/`` (``id`` = UTC timestamp, data version, random suffix);
    2. the manifest ``<root>/<parent>/_latest/<basename>.json`` is written last, in one PUT (atomic
       on S3: a GET returns the whole old or the whole new object).

    Readers resolve a key through its manifest only, so they see the previous committed version
    until the manifest names the new one, and never an uploaded-but-uncommitted version; a write
    killed before step 2 leaves the manifest and the previous version untouched.

    Concurrent writers (S3 and S3-compatible servers, through s3fs): the manifest PUT is a
    conditional write based on the manifest the writer read before its uploads (``If-Match:
    <ETag>`` of that manifest, or ``If-None-Match: *`` when the key had none; S3 conditional writes,
    AWS since 2024-11 / 2024-08, MinIO, moto). Of two writers that read the same manifest, the
    second to commit gets ``LakeConflictError`` naming the key; its objects are deleted and nothing
    of its write becomes visible. Other fsspec filesystems (``memory://``, GCS through gcsfs) have
    no conditional PUT here: the last manifest wins (``conditional_commits`` is False).

    Garbage collection (after each commit): the manifest's ``history`` keeps the ids of the last
    ``keep_versions`` committed versions (current first), whose objects are kept; a version that
    falls out of the history is deleted at once; an orphan (uploaded, never committed: a killed
    write) is deleted once its id's timestamp is older than ``orphan_grace_s`` (so a concurrent
    writer's upload in progress is not removed). A reader that resolved a manifest which then
    aged out of the history (``keep_versions`` commits later) gets FileNotFoundError on its GET and
    resolves once more (``read_bytes``).

    Args:
        root: the lake's URL, e.g. ``s3://bucket/lake``.
        storage_options: passed to ``fsspec.core.url_to_fs`` (s3fs: ``endpoint_url``,
            ``client_kwargs={"region_name": ...}``; credentials come from the standard AWS chain:
            ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, a profile, IRSA, an instance role).
        keep_versions: committed versions kept per key (>= 1; 2 = current and previous).
        orphan_grace_s: age in seconds after which an uncommitted upload is garbage.

    Raises:
        ValueError: ``keep_versions`` < 1 or a negative ``orphan_grace_s``.
    """

    def __init__(self, root: str, storage_options: dict | None = None, keep_versions: int = 2,
                 orphan_grace_s: float = 3600.0):
        import fsspec.core

        if keep_versions < 1:
            raise ValueError(f"keep_versions must be >= 1, got {keep_versions}")
        if orphan_grace_s < 0:
            raise ValueError(f"orphan_grace_s must be >= 0, got {orphan_grace_s}")
        self.root = str(root).rstrip("/")
        self.fs, self.prefix = fsspec.core.url_to_fs(self.root, **(storage_options or {}))
        self.prefix = self.prefix.rstrip("/")
        self.keep_versions = keep_versions
        self.orphan_grace_s = orphan_grace_s

    @property
    def conditional_commits(self) -> bool:
        """True when a manifest commit is a conditional PUT (s3fs: ``If-Match`` / ``If-None-Match``),
        so a concurrent commit of the same key fails with ``LakeConflictError``."""
        protocol = self.fs.protocol
        return bool({"s3", "s3a"} & set([protocol] if isinstance(protocol, str) else protocol))

    # -- naming --------------------------------------------------------------------------------
    def _split(self, key: str) -> tuple[str, str]:
        key = key.strip("/")
        if not key or any(part in ("", ".", "..", "_v", "_latest") for part in key.split("/")):
            raise ValueError(f"lake key {key!r} is empty or uses a reserved part (., .., _v, _latest)")
        parent, _, base = key.rpartition("/")
        return (f"{self.prefix}/{parent}" if parent else self.prefix), base

    def _manifest_path(self, key: str) -> str:
        parent, base = self._split(key)
        return f"{parent}/_latest/{base}.json"

    def _version_dir(self, key: str, vid: str = "") -> str:
        parent, base = self._split(key)
        return f"{parent}/_v/{base}" + (f"/{vid}" if vid else "")

    def uri(self, path: str) -> str:
        """The full URL of a filesystem path (``bucket/lake/x`` -> ``s3://bucket/lake/x``)."""
        return self.fs.unstrip_protocol(path)

    def location(self, key: str) -> str:
        """The logical URL of ``key`` (``<root>/<key>``), for messages and metadata; no object
        lives there (the data is under ``_v/``, resolved through ``_latest/``)."""
        return f"{self.root}/{key.strip('/')}"

    # -- manifests -----------------------------------------------------------------------------
    def manifest(self, key: str) -> dict | None:
        """The committed manifest of ``key``, or None when it was never committed. Raises
        ValueError naming the manifest when it is not a Crucible manifest."""
        path = self._manifest_path(key)
        try:
            raw = self.fs.cat_file(path)
        except FileNotFoundError:
            return None
        return self._parse_manifest(path, raw)

    def manifest_etag(self, key: str, attempts: int = 3) -> tuple[dict | None, str | None]:
        """The committed manifest of ``key`` and the ETag of the object it was read from
        ((None, None) when never committed; the ETag is None on filesystems without conditional
        commits). Pass the pair as ``commit(..., base=...)`` to base a commit on this manifest.
        The HEAD and the GET are tied by ``If-Match``; a manifest replaced between them is read
        again, up to ``attempts`` times.

        Raises:
            LakeConflictError: the manifest changed under each of the ``attempts`` reads.
            ValueError: the manifest is not a Crucible manifest (names it).
        """
        if not self.conditional_commits:
            return self.manifest(key), None
        path = self._manifest_path(key)
        for _ in range(attempts):
            self.fs.invalidate_cache(path)
            try:
                with self.fs.open(path, "rb") as f:     # s3fs: HEAD, then a GET with If-Match: <its ETag>
                    etag = f.details.get("ETag")
                    raw = f.read()
            except FileNotFoundError:
                return None, None
            except OSError as e:
                if _precondition_failed(e):
                    continue
                raise
            if not etag:
                raise OSError(f"lake manifest {self.uri(path)}: the server returned no ETag; conditional commits need one")
            return self._parse_manifest(path, raw), etag
        raise LakeConflictError(f"lake manifest {self.uri(path)} changed under each of {attempts} reads")

    def _parse_manifest(self, path: str, raw: bytes) -> dict:
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise ValueError(f"lake manifest {self.uri(path)} is not JSON: {e}") from None
        if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT or not isinstance(doc.get("files"), dict):
            raise ValueError(f"lake manifest {self.uri(path)}: field 'format' is not {MANIFEST_FORMAT!r} or 'files' is missing")
        return doc

    def exists(self, key: str) -> bool:
        """True when ``key`` has a committed version."""
        return self.manifest(key) is not None

    def resolve(self, key: str) -> list[str]:
        """URLs of the committed objects of ``key`` (sorted by their path inside the version).
        Raises FileNotFoundError naming the key when it was never committed."""
        doc = self.manifest(key)
        if doc is None:
            raise FileNotFoundError(f"{self.location(key)} has no committed version (no {self.uri(self._manifest_path(key))})")
        vdir = self._version_dir(key, doc["id"])
        return [self.uri(f"{vdir}/{rel}") for rel in sorted(doc["files"])]

    def read_bytes(self, key: str, rel: str | None = None, manifest: dict | None = None) -> bytes:
        """The bytes of one committed file of ``key`` (``rel``: its path inside a directory key;
        None for a single-file key). Without ``manifest`` it resolves the current one, and once
        more if the object was garbage collected between the two GETs; with ``manifest`` (from
        ``manifest(key)``) it reads that version, so several files read with one manifest come
        from one version. Raises FileNotFoundError naming the key."""
        for attempt in (0, 1):
            doc = manifest if manifest is not None else self.manifest(key)
            if doc is None:
                raise FileNotFoundError(f"{self.location(key)} has no committed version")
            name = rel if rel is not None else self._split(key)[1]
            if name not in doc["files"]:
                raise FileNotFoundError(f"{self.location(key)} (version {doc['id']}) has no file {name!r}; "
                                        f"it has {sorted(doc['files'])}")
            path = f"{self._version_dir(key, doc['id'])}/{name}"
            try:
                return self.fs.cat_file(path)
            except FileNotFoundError:
                if attempt or manifest is not None:
                    raise FileNotFoundError(f"{self.location(key)}: committed object {self.uri(path)} is missing") from None
        raise AssertionError("unreachable")

    def children(self, key: str) -> list[str]:
        """Names of the sub-folders directly under ``key`` (partition keys), unsorted. Hidden
        (``.``) and reserved (``_``) names are left out."""
        path = f"{self.prefix}/{key.strip('/')}"
        self.fs.invalidate_cache(path)
        try:
            entries = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return []
        names = [e["name"].rstrip("/").rpartition("/")[2] for e in entries if e.get("type") == "directory"]
        return [n for n in names if not n.startswith(("_", "."))]

    # -- commit --------------------------------------------------------------------------------
    def commit(self, key: str, files: dict[str, str | Path], version: str, extra: dict | None = None,
               base: tuple[dict | None, str | None] | None = None) -> dict:
        """Upload ``files`` ({path inside the version: local file}) as a new version of ``key``,
        then write the manifest (the commit), then garbage-collect. For a single-file key pass
        ``{basename: local_file}``. Returns the new manifest.

        ``base``: the (manifest, ETag) pair this write is based on (``manifest_etag``, read when a
        step read the key); default: the manifest read at the start of this call, before the
        uploads. On S3 the manifest PUT carries ``If-Match: <ETag>`` (``If-None-Match: *`` when
        the base had no manifest), so the commit fails if anyone committed ``key`` since.

        Raises:
            LakeConflictError: another writer committed ``key`` after ``base`` was read (names
                the key and the base version): this write's objects are deleted, nothing of it
                is visible, the winner's version stays current.
            OSError: an upload failed or an uploaded object has the wrong size: nothing is
                committed (the manifest and the previous version are unchanged).
            ValueError: ``files`` is empty or a path in it is absolute or climbs (``..``).
        """
        import datetime
        import secrets

        if not files:
            raise ValueError(f"commit of {key!r}: no files")
        for rel in files:
            if rel.startswith("/") or ".." in rel.split("/"):
                raise ValueError(f"commit of {key!r}: file path {rel!r} must be relative and stay inside the version")
        previous, etag = base if base is not None else self.manifest_etag(key)
        now = datetime.datetime.now(datetime.timezone.utc)
        vid = f"{now:%Y%m%dT%H%M%S%fZ}-{version}-{secrets.token_hex(4)}"
        vdir = self._version_dir(key, vid)
        meta = {}
        try:
            for rel, local in sorted(files.items()):
                local = Path(local)
                size = local.stat().st_size
                self.fs.put_file(str(local), f"{vdir}/{rel}")
                got = self.fs.info(f"{vdir}/{rel}")["size"]
                if got != size:
                    raise OSError(f"commit of {self.location(key)}: uploaded {self.uri(vdir + '/' + rel)} has {got} bytes, "
                                  f"the local file {local} {size}; not committed")
                meta[rel] = {"bytes": size, "sha256": file_sha256(local)}
        except BaseException:
            try:                                  # best effort; a killed process leaves an orphan for gc()
                self.fs.rm(vdir, recursive=True)
            except Exception:
                pass
            raise
        old_history = list(previous.get("history", [previous["id"]])) if previous else []
        history = [vid] + [h for h in old_history if h != vid][: self.keep_versions - 1]
        doc = {"format": MANIFEST_FORMAT, "key": key.strip("/"), "id": vid, "version": version, "files": meta,
               "committed_at": now.isoformat(), "history": history, **(extra or {})}
        body = json.dumps(doc, indent=1, sort_keys=True).encode()
        mpath = self._manifest_path(key)
        if not self.conditional_commits:
            self.fs.pipe_file(mpath, body)
        else:
            try:
                if etag:                             # replace exactly the manifest the base read
                    self.fs.pipe_file(mpath, body, IfMatch=etag)
                else:                                # the base had none: create only
                    self.fs.pipe_file(mpath, body, mode="create")
            except (OSError, FileExistsError) as e:
                lost = _precondition_failed(e) or isinstance(e, FileExistsError) or (etag and isinstance(e, FileNotFoundError))
                try:                                 # never committed: best effort (else an orphan for gc())
                    self.fs.rm(vdir, recursive=True)
                except Exception:
                    pass
                if not lost:
                    raise
                based = f"version {previous['id']}" if previous else "no committed version"
                raise LakeConflictError(f"commit of {self.location(key)} (based on {based}) lost to a concurrent "
                                        f"commit: {self.uri(mpath)} changed since it was read; nothing of this "
                                        f"write is visible: rerun on the new version") from None
        self.gc(key, history, dropped=[h for h in old_history if h not in history], now=now)
        return doc

    def gc(self, key: str, history: list[str], dropped: list[str] = (), now=None) -> list[str]:
        """Delete ``dropped`` versions, and orphans older than ``orphan_grace_s``, of ``key``
        (never an id in ``history``). Returns the ids deleted. Listing errors are not raised: a
        skipped collection leaves garbage, never a missing committed version."""
        import datetime

        now = now or datetime.datetime.now(datetime.timezone.utc)
        base = self._version_dir(key)
        try:
            self.fs.invalidate_cache(base)
            present = [e.rstrip("/").rpartition("/")[2] for e in self.fs.ls(base, detail=False)]
        except (FileNotFoundError, OSError):
            present = []
        gone = []
        for vid in present:
            if vid in history:
                continue
            if vid not in dropped:
                try:
                    born = datetime.datetime.strptime(vid.split("-", 1)[0], "%Y%m%dT%H%M%S%fZ").replace(tzinfo=datetime.timezone.utc)
                except ValueError:
                    continue                      # not ours: leave it
                if (now - born).total_seconds() < self.orphan_grace_s:
                    continue
            self.fs.rm(f"{base}/{vid}", recursive=True)
            gone.append(vid)
        return gone

    def write_parquet(self, df: pl.DataFrame, key: str, staging: str | Path | None = None) -> tuple[str, str]:
        """Commit ``df`` as the Parquet key ``key``: written locally (zstd, statistics: the same
        bytes and data version as ``write_parquet_atomic``), uploaded, committed. Returns
        (URL of the committed object, data version)."""
        with tempfile.TemporaryDirectory(prefix=".lake-stage.", dir=staging) as d:
            name = self._split(key)[1]
            tmp = Path(d) / name
            df.write_parquet(tmp, compression="zstd", statistics=True)
            version = file_sha256(tmp)[:16]
            doc = self.commit(key, {name: tmp}, version, {"rows": df.height})
        return self.uri(f"{self._version_dir(key, doc['id'])}/{name}"), version

    def read_parquet(self, key: str) -> pl.DataFrame:
        """The committed Parquet table ``key``. Raises FileNotFoundError naming it."""
        import io

        import polars as pl

        return pl.read_parquet(io.BytesIO(self.read_bytes(key)))

    def write_json(self, obj, key: str, indent: int = 2, staging: str | Path | None = None,
                   base: tuple[dict | None, str | None] | None = None) -> None:
        """Commit ``obj`` as JSON (keys sorted, non-JSON values as ``str``, as ``write_json_atomic``).
        ``base``: as in ``commit``. Raises LakeConflictError when a concurrent commit won."""
        with tempfile.TemporaryDirectory(prefix=".lake-stage.", dir=staging) as d:
            name = self._split(key)[1]
            tmp = Path(d) / name
            tmp.write_text(json.dumps(obj, indent=indent, sort_keys=True, default=str), encoding="utf-8")
            self.commit(key, {name: tmp}, file_sha256(tmp)[:16], base=base)

    def write_dir(self, build: str | Path, key: str, version: str, extra: dict | None = None,
                  base: tuple[dict | None, str | None] | None = None) -> dict:
        """Commit every file under the local folder ``build`` as the directory key ``key``
        (e.g. a Hugging Face dataset). ``base``: as in ``commit``. Returns the manifest. Raises
        LakeConflictError when a concurrent commit won."""
        build = Path(build)
        files = {p.relative_to(build).as_posix(): p for p in sorted(build.rglob("*")) if p.is_file()}
        return self.commit(key, files, version, extra, base=base)
