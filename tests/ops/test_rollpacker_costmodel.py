"""The paper-scale timeline model: reward queueing, stream training on drained instances, and the
ablation order on a small simulated epoch."""

import pytest

from ops.rl.rollpacker.scheduler import RoundPlanner, TailBatching, run_epoch
from ops.rl.types import Prompt
from sim.costmodel import ClusterModel, _rewards, _train, epoch_time
from sim.rollpacker import LogNormalTrace, SimEngine


def test_rewards_queue_fifo_on_the_workers():
    assert _rewards([0.0, 0.0, 0.0], [1.0, 2.0, 3.0], workers=1) == [1.0, 3.0, 6.0]
    assert _rewards([5.0, 0.0], [1.0, 1.0], workers=2) == [6.0, 1.0]


def test_stream_training_uses_drained_instances_before_the_rollout_ends():
    # 4 GPUs in 2 instances of 2; one instance drains at t=2, rollout ends at t=10; 8 GPU-s of work ready at 0
    assert _train([0.0], [8.0], [2.0, 10.0], 10.0, gpus=4, gpus_per_instance=2, stream=True) == pytest.approx(6.0)
    # without the stream trainer the work starts after the rollout on all GPUs
    assert _train([0.0], [8.0], [2.0, 10.0], 10.0, gpus=4, gpus_per_instance=2, stream=False) == pytest.approx(12.0)
    # work left at the rollout's end finishes on every GPU
    assert _train([0.0], [40.0], [2.0, 10.0], 10.0, gpus=4, gpus_per_instance=2, stream=True) == pytest.approx(16.0)


def test_each_rollpacker_stage_shortens_the_epoch():
    cm = ClusterModel(gpus=16, gpus_per_instance=2, reward_workers=8)
    ps = [Prompt(f"p{i}") for i in range(10 * 16)]

    def rounds(tb):
        eng = SimEngine(LogNormalTrace(median=500, seed=2), instances=cm.instances, max_seqs=cm.max_seqs)
        return run_epoch(eng, RoundPlanner(ps, TailBatching(16, 4, 1.25, enabled=tb)), 16384, 1e9)

    base, tb = rounds(False), rounds(True)
    t = [epoch_time(base, cm, False, False)["total_s"], epoch_time(tb, cm, False, False)["total_s"],
         epoch_time(tb, cm, True, False)["total_s"], epoch_time(tb, cm, True, True)["total_s"]]
    assert t[0] > t[1] > t[2] > t[3]
