"""Discrete simulators and cost models, used only by benchmarks and tests.

Nothing under ``assets/``, ``ops/``, ``pipelines/`` or ``resources/`` (assets, drivers, the real
schedulers) may import this package; ``tests/test_import_direction.py`` checks it. Simulators
import what they share with production code from ``ops`` (direction: ``sim`` -> ``ops``).

Modules:
    rollarc        RollArc's discrete-event simulator of the agentic workload and the routing
                   ablation: ``TurnShapes`` (the per-turn token law, shared with
                   ``traces.AgenticTurns``), ``AgenticWorkload``, ``simulate``, ``routing_ablation``
    rollarc_roles  RollArc's simulated roles (engines, environments, reward) in real time:
                   ``SimConfig``, ``SimRoles``
    roofline       roofline step costs (vendor peaks, model shapes, KV cache) with the GPU
                   calibration override: ``Roofline``, ``HardwareProfile``, ``ModelConfig``
    traces         keyed workload traces: ``LogNormalLaw`` (the length law), ``LogNormalLengths``,
                   ``MeasuredLengths``, ``ScriptedLengths``, ``AgenticTurns``
    des            the discrete-event simulator of both papers on equal GPUs (a package: ``engine``,
                   the virtual clock, event queue, engine instances and ``ServedModel``, the model /
                   GPUs / roofline base of both configs; ``rollpacker`` and ``rollarc``, one module
                   per system): ``simulate_rollpacker``, ``simulate_rollarc``, ``DESEngine``, ``Instance``
"""
