"""The lake's conflict error and the S3 conditional-request failure test."""

from __future__ import annotations


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

