"""Figures are written to the lake beside their asset and linked from the metadata (issue 43.5):
``assets._meta.image`` writes the PNG once under a content-addressed name (atomic locally, one PUT on
an object store) and returns a ``path`` (local root) or ``url`` (``s3://``) metadata value; no PNG
is inlined into the event log any more."""

import hashlib
from pathlib import Path

import dagster as dg
import pytest

from assets._meta import FIGURES_DIR, image, write_figure
from ops import figures
from resources.lake import LakeResource


class PlotConfig(dg.Config):
    label: str = "first"


@dg.asset
def plot(config: PlotConfig, lake: LakeResource) -> dg.MaterializeResult:
    png = figures.funnel([("read", 3), ("kept", 2)], config.label)
    return dg.MaterializeResult(metadata={"figure": image(png, "funnel", lake=lake, asset="plot")})


def _figure_meta(instance) -> dg.MetadataValue:
    return instance.get_latest_materialization_event(dg.AssetKey("plot")).asset_materialization.metadata["figure"]


def test_a_figure_is_written_once_beside_its_asset_and_the_metadata_points_at_it(tmp_path):
    lake = LakeResource(root=str(tmp_path / "lake"))
    folder = tmp_path / "lake" / "plot" / FIGURES_DIR
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        run = lambda label: dg.materialize([plot], instance=instance, resources={"lake": lake},
                                           run_config={"ops": {"plot": {"config": {"label": label}}}})
        assert run("first").success
        meta = _figure_meta(instance)
        assert isinstance(meta, dg.PathMetadataValue)
        png = figures.funnel([("read", 3), ("kept", 2)], "first")      # the asset's figure, drawn again
        target = Path(meta.path)
        assert target.parent == folder and target.name == hashlib.sha256(png).hexdigest()[:16] + ".png"
        assert target.read_bytes() == png
        assert [p.name for p in folder.iterdir()] == [target.name]     # no temporary file left
        stat = target.stat()

        assert run("first").success                                     # the same figure again
        assert _figure_meta(instance).path == str(target)
        assert [p.name for p in folder.iterdir()] == [target.name]     # no second copy
        assert (target.stat().st_ino, target.stat().st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns)   # not rewritten

        assert run("second").success                                    # another figure: another file
        other = Path(_figure_meta(instance).path)
        assert other != target and other.read_bytes() == figures.funnel([("read", 3), ("kept", 2)], "second")
        assert sorted(p.name for p in folder.iterdir()) == sorted([target.name, other.name])
        assert lake.partitions("plot") == []                            # _figures is never taken for a partition
        # nothing of the PNG in the event log
        records = instance.fetch_materializations(dg.AssetKey("plot"), limit=10).records
        assert len(records) == 3 and all("base64" not in str(r.asset_materialization.metadata) for r in records)


def test_a_figure_that_is_not_a_png_is_refused_naming_the_asset(tmp_path):
    lake = LakeResource(root=str(tmp_path / "lake"))
    with pytest.raises(ValueError, match=r"figure of gba_run: not a PNG .*'AUC'"):
        image(b"<svg/>", "AUC", lake=lake, asset="gba_run")
    assert not (tmp_path / "lake" / "gba_run").exists()


def test_a_figure_on_an_object_store_root_is_one_object_linked_by_its_url(tmp_path, monkeypatch):
    """The same through the lake resource on an ``s3://`` root (a moto S3 server on loopback)."""
    import boto3

    from tests.moto_s3 import moto_s3_server

    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    png = figures.funnel([("read", 3), ("kept", 2)], "s3")
    name = hashlib.sha256(png).hexdigest()[:16] + ".png"
    with moto_s3_server("figs") as endpoint:
        (tmp_path / "work").mkdir()
        lake = LakeResource(root="s3://figs/lake", endpoint_url=endpoint, region="us-east-1", work_dir=str(tmp_path / "work"))
        meta = image(png, "funnel", lake=lake, asset="raw_problems")
        assert isinstance(meta, dg.UrlMetadataValue) and meta.url == f"s3://figs/lake/raw_problems/{FIGURES_DIR}/{name}"
        c = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        assert c.get_object(Bucket="figs", Key=f"lake/raw_problems/{FIGURES_DIR}/{name}")["Body"].read() == png
        assert write_figure(png, lake, "raw_problems") == (meta.url, False)           # already there: not written
        assert [o["Key"] for o in c.list_objects_v2(Bucket="figs")["Contents"]] == [f"lake/raw_problems/{FIGURES_DIR}/{name}"]
        assert lake.partitions("raw_problems") == []
