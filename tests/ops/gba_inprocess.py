"""Driving a GBA ``ParameterServer`` with W workers in this process (the tests' stand-in for the RPC
workers of ``ops.gba.ps``): one event advances one worker by a pull, or by its forward/backward
and a push. The caller picks which worker moves next."""

from __future__ import annotations

from ops.gba.data import SampleStream, take
from ops.gba.model import WorkerModel


class InProcessWorkers:
    """``workers`` workers of ``spec`` over ``data`` talking to ``server`` directly. ``live`` holds
    the workers that have not been told to stop."""

    def __init__(self, server, data, spec, workers: int):
        self.server, self.data = server, data
        self.models = [WorkerModel(data.fields, spec.train, w) for w in range(workers)]
        self.stream = SampleStream(data.n_train, spec.local_batch, spec.train.seed)
        self.state = {w: {"batch": None, "work": None, "version": -1} for w in range(workers)}
        self.live = set(range(workers))

    def step(self, w: int) -> None:
        """One event of worker ``w``: a pull when it holds no work, else compute + push."""
        s, server = self.state[w], self.server
        idx = self.stream.indices(s["batch"])
        b, y = take(self.data.train, idx), self.data.y_train[idx]
        ids = self.models[w].ids(b)
        if s["work"] is None:
            r = server.pull(w, s["batch"], {t: u for t, (u, _) in ids.items()}, s["version"])
            if r[0] == "stop":
                self.live.discard(w)
            elif r[0] == "work":
                s["work"] = r
            return
        _, token, rows, dense, s["version"] = s["work"]
        r = server.push(w, token, s["batch"], self.models[w].gradient(b, y, ids, rows, dense))
        s["work"] = None
        if r[0] == "stop":
            self.live.discard(w)
        else:
            s["batch"] = r[1]
