"""The lake: Parquet tables under a root folder, written atomically, with content-hash versions.

Layout: ``<root>/<asset>/data.parquet`` and, for partitioned assets,
``<root>/<asset>/<partition>/data.parquet``; side tables sit beside them (``quarantine.parquet``).
Writes go to a temporary file in the same folder, then ``os.replace`` — a reader never sees a
half-written table and a failed step leaves the previous version in place (docs/operations.md, "Failure behaviour").
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the atomic writers are stdlib-only: a results JSON is written without polars
    import polars as pl


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _publish_mode(path: Path, directory: bool = False) -> None:
    """Give a temp file/dir the permissions a normal create would (mkstemp/mkdtemp use 0600/0700)."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


def write_parquet_atomic(df: pl.DataFrame, path: str | Path) -> str:
    """Write ``df`` to ``path`` atomically (``atomic_path``). Returns the data version
    (first 16 hex digits of the file's SHA-256; same rows in the same order -> same version)."""
    with atomic_path(path) as tmp:
        df.write_parquet(tmp, compression="zstd", statistics=True)
        version = file_sha256(tmp)[:16]
    return version


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """The one atomic write of the project: yield a temporary path in ``path``'s folder; when the
    block finishes, the temporary file gets the permissions of a normal create and is renamed onto
    ``path`` (``os.replace``); when the block raises, it is removed and ``path`` keeps its previous
    content. A reader sees the old file or the new one, never a half-written one.

    Usage::

        with atomic_path(out / "model.safetensors") as tmp:
            save_file(tensors, str(tmp))
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        _publish_mode(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(obj, path: str | Path, indent: int = 2, *, sort_keys: bool = True, default=str) -> None:
    """Write ``obj`` as JSON atomically (``atomic_path``); keys sorted (``sort_keys``), other values
    through ``default`` (``str``; ``float`` keeps numpy scalars as numbers)."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=indent, sort_keys=sort_keys, default=default), encoding="utf-8")


def replace_dir_atomic(build: Path, final: Path) -> None:
    """Swap a fully built directory into place: the old one is renamed aside, then removed.

    Between the two renames ``final`` is briefly absent, never partially written.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    old = final.with_name(f".{final.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(build, final)
    if old.exists():
        shutil.rmtree(old)


def write_hf_dataset(df: pl.DataFrame, final_dir: str | Path, card: str) -> str:
    """Write ``df`` in the Hugging Face ``datasets`` Parquet layout, atomically.

    Layout: ``<final_dir>/data/train-00000-of-00001.parquet`` and ``<final_dir>/README.md`` (the
    dataset card, YAML header with ``configs``). Loadable with
    ``datasets.load_dataset("parquet", data_dir=final_dir)`` or ``load_dataset(final_dir)``.
    Returns the data version of the Parquet file.
    """
    final = Path(final_dir)
    final.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{final.name}.build.", dir=final.parent))
    _publish_mode(build, directory=True)
    try:
        version = write_parquet_atomic(df, build / "data" / "train-00000-of-00001.parquet")
        (build / "README.md").write_text(card, encoding="utf-8")
        _publish_mode(build / "data", directory=True)
        replace_dir_atomic(build, final)
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    return version


# ---------------------------------------------------------------------------------------------
# Object-store roots (s3://..., any fsspec URL): no rename, so a commit is "objects, then manifest".
# docs/operations.md, "Lake on object storage".

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


# ---------------------------------------------------------------------------------------------
# Tables on object storage: Delta Lake (delta-rs), an open format that Spark, Polars, DuckDB and Trino
# read, with optimistic concurrency (a conflicting commit fails) and time travel.
# docs/operations.md, "Lake on object storage".

DATA_VERSION_KEY = "crucible.data_version"
ROWS_KEY = "crucible.rows"
DTYPES_KEY = "crucible.polars_dtypes"
_RESTORED_DTYPES = ("UInt8", "UInt16", "UInt32", "UInt64", "Categorical")
_NO_DATA_CHANGE_OPS = ("VACUUM START", "VACUUM END")
DEFAULT_VACUUM_RETENTION_HOURS = 168      # Delta's delta.deletedFileRetentionDuration default (1 week)


class LakeConflictError(RuntimeError):
    """A commit lost against a concurrent commit of the same table (Delta Lake's optimistic
    concurrency) or of the same JSON file / dataset folder (``ObjectStoreLake``'s conditional
    manifest PUT): nothing of the losing write is visible; rerun the step on the new version."""


def _precondition_failed(e: BaseException) -> bool:
    """True when ``e`` (an s3fs-translated error) is an S3 conditional-request failure: 412
    PreconditionFailed, or 409 ConditionalRequestConflict (AWS: a concurrent conditional write of the
    same key in flight)."""
    cause = e.__cause__
    resp = getattr(cause, "response", None) or {}
    code = (resp.get("Error") or {}).get("Code", "")
    status = (resp.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412)


def parquet_data_version(df: pl.DataFrame) -> str:
    """The data version of ``df``: the first 16 hex digits of the SHA-256 of its Parquet encoding
    (zstd, statistics: the bytes ``write_parquet_atomic`` writes, so a table has the same version on
    a local root and in a Delta table; same rows in the same order -> same version)."""
    import io

    buf = io.BytesIO()
    df.write_parquet(buf, compression="zstd", statistics=True)
    return hashlib.sha256(buf.getvalue()).hexdigest()[:16]


def delta_storage_options(root: str, endpoint_url: str = "", region: str = "") -> dict[str, str]:
    """delta-rs storage options for ``root``. For ``s3://``: the endpoint (HTTP allowed only when the
    endpoint is ``http://``, e.g. a loopback moto or MinIO), the region, and ``conditional_put=etag``
    so a commit is a put-if-absent of ``_delta_log/<version>.json`` (S3 and S3-compatible servers
    with conditional writes; no DynamoDB lock table needed). Credentials come from the standard AWS
    chain (environment, web identity, instance role), never from here."""
    opts: dict[str, str] = {}
    if root.split("://", 1)[0] in ("s3", "s3a"):
        opts["conditional_put"] = "etag"
        if endpoint_url:
            opts["AWS_ENDPOINT_URL"] = endpoint_url
            if endpoint_url.startswith("http://"):
                opts["AWS_ALLOW_HTTP"] = "true"
        if region:
            opts["AWS_REGION"] = region
    return opts


class DeltaTables:
    """The lake's tables as Delta Lake tables under ``root`` (``s3://bucket/prefix``, a local folder).

    A table key ``<asset>[/<partition>]/<name>.parquet`` lives at ``<root>/<asset>[/<partition>]/<name>.delta``
    (a Delta table: Parquet files plus ``_delta_log/``). Each write is an overwrite commit carrying
    the data version and row count in its commit info (``crucible.data_version``, ``crucible.rows``);
    a commit is the put-if-absent of the next log entry, so two writers that read the same table
    version cannot both commit: the loser gets ``LakeConflictError`` and nothing of its write is
    visible. Earlier versions stay readable (``read(key, version=n)``) until vacuumed.

    Unsigned integer and Categorical columns (Delta has neither) are stored as Int64 (UInt64: the
    same 64 bits, so values >= 2**63 read negative in other engines) / strings and cast back on read
    (top-level columns; the dtypes are in the commit info ``crucible.polars_dtypes``).

    Args:
        root: the lake root URL or folder.
        storage_options: delta-rs options (``delta_storage_options``).
    """

    def __init__(self, root: str, storage_options: dict[str, str] | None = None):
        self.root = str(root).rstrip("/")
        self.storage_options = dict(storage_options or {})

    def uri(self, key: str) -> str:
        """The table folder of ``key`` (``a/b/data.parquet`` -> ``<root>/a/b/data.delta``). Raises
        ValueError for a key that is not ``*.parquet`` or climbs (``..``)."""
        key = key.strip("/")
        if not key.endswith(".parquet") or any(p in ("", ".", "..") for p in key.split("/")):
            raise ValueError(f"table key {key!r} must be '<asset>[/<partition>]/<name>.parquet'")
        return f"{self.root}/{key[: -len('.parquet')]}.delta"

    def _table(self, key: str, version: int | None = None):
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.uri(key), version=version, storage_options=self.storage_options)
        except TableNotFoundError:
            raise FileNotFoundError(f"{self.uri(key)} is not a Delta table (never committed)") from None

    def exists(self, key: str) -> bool:
        """True when ``key`` has a committed version.

        Note: deltalake 1.6.6's ``is_deltatable`` and ``history`` keep the GIL during their
        requests, so an S3 server running inside the same Python process (moto's
        ``ThreadedMotoServer``) deadlocks them until delta-rs' 180 s retry timeout; run test
        servers as a separate process (tests/test_lake_s3.py)."""
        try:
            self._table(key)
        except FileNotFoundError:
            return False
        return True

    def write(self, df: pl.DataFrame, key: str, read_version: int | None = None) -> tuple[str, str]:
        """Commit ``df`` as the new version of ``key`` (overwrite; the schema may change). With
        ``read_version`` the commit is based on that table version, as a step that read the table
        at that version would be: if anyone committed since, it conflicts. Returns (table URI, data
        version).

        Raises:
            LakeConflictError: a concurrent commit won (names the table and the base version).
        """
        from deltalake import CommitProperties, write_deltalake
        from deltalake.exceptions import CommitFailedError

        import polars as pl

        version = parquet_data_version(df)
        restore = {c: str(t) for c, t in df.schema.items() if str(t) in _RESTORED_DTYPES}
        meta = {DATA_VERSION_KEY: version, ROWS_KEY: str(df.height)}
        if restore:
            meta[DTYPES_KEY] = json.dumps(restore, sort_keys=True)
            df = df.with_columns((pl.col(c).reinterpret(signed=True) if t == "UInt64"      # bits kept: > 2**63 too
                                  else pl.col(c).cast(pl.Int64 if t.startswith("UInt") else pl.String))
                                 for c, t in restore.items())
        uri = self.uri(key)
        target = self._table(key, read_version) if read_version is not None else uri
        try:
            # one chunk: delta-rs 1.6.6 writes the record batches of a multi-chunk frame out of order
            write_deltalake(target, df.rechunk().to_arrow(), mode="overwrite", schema_mode="overwrite",
                            storage_options=None if read_version is not None else self.storage_options,
                            commit_properties=CommitProperties(custom_metadata=meta))
        except CommitFailedError as e:
            base = f"version {read_version}" if read_version is not None else "the version it read"
            raise LakeConflictError(f"commit to {uri} (based on {base}) lost to a concurrent commit: {e}") from None
        return uri, version

    def read(self, key: str, version: int | None = None) -> pl.DataFrame:
        """The table ``key`` at its current version (or ``version``: time travel). Raises
        FileNotFoundError naming the table when it was never committed."""
        import polars as pl

        dt = self._table(key, version)
        df = pl.from_arrow(dt.to_pyarrow_table())
        info = self._commit_info(dt)
        restore = json.loads(info.get(DTYPES_KEY, "{}"))
        if restore:
            df = df.with_columns((pl.col(c).reinterpret(signed=False) if t == "UInt64" else pl.col(c).cast(getattr(pl, t)))
                                 for c, t in restore.items() if c in df.columns)
        return df

    @staticmethod
    def _commit_info(dt) -> dict:
        """The commit info of the newest commit that wrote the current data: VACUUM's own commits
        (``VACUUM START`` / ``VACUUM END``, no data change) are skipped, so the data version and
        the dtypes to restore survive a vacuum."""
        limit = 5
        while True:
            hist = dt.history(limit)
            for h in hist:
                if h.get("operation") not in _NO_DATA_CHANGE_OPS:
                    return h
            if len(hist) < limit:
                return hist[0] if hist else {}
            limit *= 4

    def info(self, key: str) -> dict:
        """``{"data_version", "rows", "table_version"}`` of the current version (from the commit
        info; a version committed by another engine is read to compute them). Raises
        FileNotFoundError naming the table."""
        dt = self._table(key)
        info = self._commit_info(dt)
        if DATA_VERSION_KEY in info:
            return {"data_version": info[DATA_VERSION_KEY], "rows": int(info[ROWS_KEY]), "table_version": dt.version()}
        df = self.read(key)
        return {"data_version": parquet_data_version(df), "rows": df.height, "table_version": dt.version()}

    def file_uris(self, key: str) -> list[str]:
        """URLs of the Parquet files of the current version (what DuckDB's ``read_parquet`` reads)."""
        return sorted(self._table(key).file_uris())

    def vacuum(self, table_uri: str, retention_hours: int | None = None, dry_run: bool = False,
               enforce_retention_duration: bool = True) -> list[str]:
        """Delta ``VACUUM`` of the table at ``table_uri`` (a full vacuum: every file the log does not
        reference, a killed writer's uncommitted Parquet files included, and files of versions
        overwritten more than the retention ago), deleting only files older than
        ``retention_hours`` (None: the table's ``delta.deletedFileRetentionDuration``, default 168
        h). Time travel to versions whose files were removed stops working. Returns the paths,
        relative to the table, deleted (or, with ``dry_run``, that would be).

        A retention shorter than the table's configured one is refused unless
        ``enforce_retention_duration`` is False: a writer still uploading for longer than the
        retention would lose its files before its commit (Delta Lake protocol, "VACUUM").

        Raises:
            ValueError: a retention below the table's minimum while enforced, or a negative one
                (names the table).
            FileNotFoundError: no Delta table at ``table_uri``.
        """
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError, TableNotFoundError

        if retention_hours is not None and retention_hours < 0:
            raise ValueError(f"vacuum of {table_uri}: retention_hours must be >= 0, got {retention_hours}")
        try:
            dt = DeltaTable(table_uri, storage_options=self.storage_options)
        except TableNotFoundError:
            raise FileNotFoundError(f"{table_uri} is not a Delta table") from None
        try:
            return sorted(dt.vacuum(retention_hours=retention_hours, dry_run=dry_run,
                                    enforce_retention_duration=enforce_retention_duration, full=True))
        except DeltaError as e:
            if "retention" in str(e).lower():
                raise ValueError(f"vacuum of {table_uri}: {e}; pass a longer retention, or disable the "
                                 "enforcement when no writer is running") from None
            raise


def find_delta_tables(fs, prefix: str) -> list[str]:
    """Filesystem paths (no protocol) of the Delta tables under ``prefix``: the folders that hold a
    ``_delta_log/`` (one listing of every object under ``prefix``), sorted."""
    prefix = prefix.rstrip("/")
    try:
        fs.invalidate_cache(prefix)
        paths = fs.find(prefix)
    except FileNotFoundError:
        return []
    return sorted({p.split("/_delta_log/", 1)[0] for p in paths if "/_delta_log/" in p})

