"""`streamcorr demo` as a newcomer runs it, headless: the scripted faults must show up as the right events."""

import re

import numpy as np

from streamcorr.cli import main
from streamcorr.demo.rig import Rig

EVENT = re.compile(r"^event t=([\d.]+)s .*?(rise|fall|became-dependent|became-independent) (\S+)~(\S+) ")


def test_demo_headless_reports_the_scripted_faults_on_the_right_pairs(capsys):
    """The demo command on a compressed script (faults at 20, 40, 60 s) prints every scripted change of state
    (became-dependent / became-independent) on its pair, and no event on a pair the script keeps stable other
    than the engine's verdict on the starting state (a coupled pair reported dependent before the first fault)."""
    np.random.default_rng(0)  # the rig is seeded by --seed
    assert main(["demo", "--no-web", "--speed", "4", "--script-scale", "0.5", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    rig = Rig(0, script_scale=0.5)
    coupled = {tuple(sorted(p)) for p in rig.coupled_at_start()}
    got, seen, verdicts = set(), set(), set()
    for line in out.splitlines():
        m = EVENT.match(line)
        if m:
            t, kind, pair = float(m.group(1)), m.group(2), tuple(sorted((m.group(3), m.group(4))))
            first = pair not in seen
            seen.add(pair)
            if first and pair in coupled and kind == "became-dependent" and t < rig.script[0].t_s:
                verdicts.add(pair)
                continue
            got.add((pair, kind))
    state_changes = {
        (tuple(sorted(p)), kind)
        for change in rig.script
        for p, kind in change.expected
        if kind in ("became-dependent", "became-independent")
    }
    assert state_changes, "the script has no state changes to check"
    assert state_changes <= got, f"missing: {sorted(state_changes - got)}"
    stable = {tuple(sorted(p)) for p in rig.stable_pairs()}
    assert not [e for e in got if e[0] in stable], "events on stable pairs"
    assert verdicts == coupled, f"starting couplings not reported: {sorted(coupled - verdicts)}"
    assert out.count("script: t=") == 3
