"""`streamcorr demo` as a newcomer runs it, headless: the scripted faults must show up as the right events."""

import re

from streamcorr.cli.commands import main
from streamcorr.demo.rig import Rig

EVENT = re.compile(r"^event t=[\d.]+s .*?(rise|fall|became-dependent|became-independent) (\S+)~(\S+) ")


def test_demo_headless_reports_the_scripted_faults_on_the_right_pairs(capsys):
    """The demo command on a compressed script (faults at 20, 40, 60 s) prints every scripted change of state
    (became-dependent / became-independent) on its pair, and no event on a pair the script keeps stable (a verdict
    at a pair's first assessment, marked initial, is its starting state)."""
    assert main(["demo", "--no-web", "--speed", "4", "--script-scale", "0.5", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    got = set()
    for line in out.splitlines():
        m = EVENT.match(line)
        if m and "(initial" not in line:  # a pair's verdict at its first assessment is its starting state
            a, b = m.group(2), m.group(3)
            got.add((tuple(sorted((a, b))), m.group(1)))
    rig = Rig(0, script_scale=0.5)
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
    assert out.count("script: t=") == 3
