"""scripts/sf_blocks.py's analysis: a host condition switched in blocks inside one run shows as its
effect on the step time, with a t-interval over rounds, whatever the run's slow drift."""

from __future__ import annotations

import importlib.util
import math
import random

from tests.helpers import REPO

spec = importlib.util.spec_from_file_location("sf_blocks", REPO / "scripts" / "sf_blocks.py")
sf_blocks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sf_blocks)


def test_a_condition_costing_two_percent_is_measured_through_a_drifting_run():
    rng = random.Random(0)
    blocks, steps, t = [], [], 0.0
    for rnd in range(4):
        order = sf_blocks.CONDITIONS[:]
        rng.shuffle(order)
        for poll, pin in order:
            t0 = t
            drift = 1.0 + 0.01 * math.sin(t / 40.0)  # the host's slow wander, the same for every condition
            for _ in range(10):
                s = 1.2 * drift * (1.02 if poll else 1.0) * (1 + rng.gauss(0, 0.003))
                t += s
                steps.append({"time": t, "step_time_s": s})
            blocks.append({"round": rnd, "poll": poll, "pin": pin, "t0": t0, "t1": t})
    out = sf_blocks.analyse(blocks, steps, steal=[])
    poll, pin = out["effects"]["poll"], out["effects"]["pin"]
    assert out["rounds"] == 4 and poll["rounds"] == 4
    assert 1.5 < poll["pct"] < 2.5 and poll["ci"][0] > 0  # about +2%, its CI clear of 0
    assert pin["ci"][0] < 0 < pin["ci"][1]  # no effect: its CI holds 0
    assert all(b["steps"] >= 8 for b in blocks)  # the steps wholly inside each block
