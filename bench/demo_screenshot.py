"""Screenshot of the demo's live web view for the README, taken in headless Chromium.

    python -m bench.demo_screenshot   ->  bench/results/demo_web_view.png

Runs `streamcorr demo --speed 3` (so the scripted faults at 40 and 80 s of simulated time have happened),
hovers the Pearson-blind pair j1.vib x m1.current and captures the page.
"""

from __future__ import annotations

import subprocess
import sys
import time

from playwright.sync_api import sync_playwright

from streamcorr.demo.rig import CHANNELS

from .common import RESULTS

PORT = 8061


def main() -> int:
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamcorr.cli.commands",
            "demo",
            "--speed",
            "3",
            "--duration",
            "400",
            "--port",
            str(PORT),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(55)  # about 150 s of simulated time
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"http://127.0.0.1:{PORT}/")
            page.wait_for_selector("#heatmap[data-seq]")
            page.wait_for_timeout(2500)
            geo = page.evaluate("() => ({...document.querySelector('#heatmap').dataset})")
            box = page.locator("#heatmap").bounding_box()
            assert box is not None
            i, j = CHANNELS.index("j1.vib"), CHANNELS.index("m1.current")  # the demo's matrix order
            cell, x0, y0 = float(geo["cell"]), float(geo["x0"]), float(geo["y0"])
            page.mouse.move(box["x"] + x0 + (j + 0.5) * cell, box["y"] + y0 + (i + 0.5) * cell)
            page.wait_for_timeout(1500)
            out = RESULTS / "demo_web_view.png"
            page.screenshot(path=str(out), full_page=True)
            browser.close()
        print(out)
    finally:
        demo.terminate()
        demo.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
