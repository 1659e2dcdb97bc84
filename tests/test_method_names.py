"""Issue 41 item 1: a method has one name in ops (the drivers), sim (the discrete-event simulator)
and benchmarks (rl_sim), so a simulated row and a real row of the same method line up by name."""

import importlib


def test_rl_method_names_are_the_drivers_in_sim_and_benchmarks():
    from ops.rl.rollarc.spec import METHODS as ARC
    from ops.rl.rollpacker.driver import METHODS as PACKER
    from sim.des.rollarc import RA_METHODS, ra_method
    from sim.des.rollpacker import RP_METHODS

    rl_sim = importlib.import_module("benchmarks.rl_sim")
    # RollPacker: the same four names with the same (tail batching, reward scheduler, stream trainer) flags
    assert RP_METHODS == PACKER and set(rl_sim.RP_METHODS) == set(PACKER)
    # RollArc: every simulated name is a driver method (the driver's "rollarc" = the spec's async_ratio)
    assert set(RA_METHODS) <= set(ARC) and set(rl_sim.RA_METHODS) <= set(ARC)
    assert set(ARC) - set(RA_METHODS) == {"rollarc"}
    assert ra_method("rollarc_a2") == ("async", 2, True, False)      # the name carries the ratio, as in the driver
