"""The lake: tables under a root folder or an object store, written atomically, with content-hash versions.

A package split by concern (every ``from ops.lake import X`` of the single module still works):

- ``atomic``: the one rename-based writer (``atomic_path``, ``write_parquet_atomic``,
  ``write_json_atomic``, ``replace_dir_atomic``, ``write_hf_dataset``) and ``file_sha256``;
- ``errors``: ``LakeConflictError``, ``LegacyTableError``;
- ``objectstore``: ``ObjectStoreLake``, versioned objects plus a manifest commit for JSON files and
  dataset folders on ``s3://`` roots (docs/operations.md, "Lake on object storage");
- ``delta``: ``DeltaTables``, the lake's tables as Delta Lake tables, and ``find_delta_tables``.
"""

from ops.lake.atomic import (_publish_mode, _umask, atomic_path, file_sha256, replace_dir_atomic, write_hf_dataset,
                             write_json_atomic, write_parquet_atomic)
from ops.lake.delta import (_NO_DATA_CHANGE_OPS, _RESTORED_DTYPES, DATA_VERSION_KEY, DEFAULT_VACUUM_RETENTION_HOURS,
                            DTYPES_KEY, ROWS_KEY, DeltaTables, delta_storage_options, find_delta_tables,
                            parquet_data_version)
from ops.lake.errors import LakeConflictError, LegacyTableError, _precondition_failed
from ops.lake.objectstore import MANIFEST_FORMAT, ObjectStoreLake, is_object_store

__all__ = ["DATA_VERSION_KEY", "DEFAULT_VACUUM_RETENTION_HOURS", "DTYPES_KEY", "MANIFEST_FORMAT", "ROWS_KEY",
           "DeltaTables", "LakeConflictError", "LegacyTableError", "ObjectStoreLake", "atomic_path", "delta_storage_options",
           "file_sha256", "find_delta_tables", "is_object_store", "parquet_data_version", "replace_dir_atomic",
           "write_hf_dataset", "write_json_atomic", "write_parquet_atomic"]
