"""A one-asset code location for tests/test_killed_run.py: ``kill_model`` launches
tests/_kill_driver.py through the launch protocol (assets.launch: run folder per run lineage,
resume, staged output committed by the step) on ``ComputeResource`` (the guarded launch), in a job
with the in-process executor (the run worker is the step process)."""

import dagster as dg

from assets.launch import launch, run_dir_for, staged
from ops.launch import spec_fingerprint
from resources.compute import ComputeResource


class KillModelConfig(dg.Config):
    lake: str
    """The lake root (a temp dir of the test)."""
    steps: int = 10
    step_s: float = 1.0
    tag: str = "a"
    """Written into the output: tells two materializations apart."""


@dg.asset
def kill_model(context: dg.AssetExecutionContext, config: KillModelConfig, compute: ComputeResource) -> dg.MaterializeResult:
    stage = staged(run_dir_for(context, config.lake, "kill_model"), "kill_model")
    spec = {"steps": config.steps, "step_s": config.step_s, "tag": config.tag, "stage": str(stage)}
    fp = spec_fingerprint({k: v for k, v in spec.items() if k != "stage"}, "")
    with launch(context, compute, base=config.lake, asset="kill_model", module="tests._kill_driver", spec=spec,
                fingerprint=fp, timeout_s=120.0, outputs={"kill_model": f"{config.lake}/kill_model/committed"}) as run:
        text = (stage / "model.txt").read_text()
        if f"tag {config.tag}" not in text:
            raise dg.Failure(f"kill_model: the staged output is not this run's: {text!r}")
        return dg.MaterializeResult(metadata={**run.metadata(), "resumed_from_step": run.result["resumed_from"]})


kill_job = dg.define_asset_job("kill_job", selection=[kill_model], executor_def=dg.in_process_executor)

defs = dg.Definitions(assets=[kill_model], jobs=[kill_job], resources={"compute": ComputeResource()})
