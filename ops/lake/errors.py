"""The lake's errors (a lost commit, a table of the pre-Delta local layout) and the S3
conditional-request failure test."""

from __future__ import annotations


class LakeConflictError(RuntimeError):
    """A commit lost against a concurrent commit of the same table (Delta Lake's optimistic
    concurrency) or of the same JSON file / dataset folder (``ObjectStoreLake``'s conditional
    manifest PUT): nothing of the losing write is visible; rerun the step on the new version."""


class LegacyTableError(FileNotFoundError):
    """A table has no Delta version, but a table of the pre-Delta local layout (one plain Parquet
    file ``<asset>[/<partition>]/<name>.parquet``) is in its place: Crucible no longer reads it.
    The message names the file and the fix (rematerialize the asset). A FileNotFoundError, so
    callers that treat a missing table as missing still stop; callers that treat a missing table
    as optional must re-raise it."""


def _precondition_failed(e: BaseException) -> bool:
    """True when ``e`` (an s3fs-translated error) is an S3 conditional-request failure: 412
    PreconditionFailed, or 409 ConditionalRequestConflict (AWS: a concurrent conditional write of the
    same key in flight)."""
    cause = e.__cause__
    resp = getattr(cause, "response", None) or {}
    code = (resp.get("Error") or {}).get("Code", "")
    status = (resp.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412)

