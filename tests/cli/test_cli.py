import subprocess
import sys

import numpy as np

from streamcorr.cli.commands import main


def test_import_is_cheap():
    """Importing streamcorr loads neither torch nor numba; they load on first use of the API."""
    code = "import sys, streamcorr; print('torch' in sys.modules, 'numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_static_demo_prints_pearson_and_mi(capsys):
    """`streamcorr demo --static` estimates fixed relations; MI flags the quadratic one that Pearson misses."""
    assert main(["demo", "--static", "--window-len", "1000"]) == 0
    lines = {
        line[:34].strip(): line[34:].split() for line in capsys.readouterr().out.splitlines() if line[:1].isalpha()
    }
    pearson, mi = map(float, lines["quadratic y = x^2 + noise"])
    assert abs(pearson) < 0.2 and mi > 0.5
    assert float(lines["independent"][1]) < 0.05


def test_estimate_command_reads_csv(tmp_path, capsys):
    """`streamcorr estimate file.csv x y` prints the MI of two columns; a wrong column is a clean error."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(500)
    path = tmp_path / "d.csv"
    np.savetxt(path, np.c_[x, x + 0.5 * rng.standard_normal(500)], delimiter=",", header="a,b", comments="")
    assert main(["estimate", str(path), "a", "b"]) == 0
    assert float(capsys.readouterr().out) > 0.5
    assert main(["estimate", str(path), "a", "zz"]) == 2
    assert "column 'zz'" in capsys.readouterr().err


def test_matrix_command_prints_and_writes_png(tmp_path, capsys):
    """`streamcorr matrix` prints the MI of every column pair and writes a heatmap; Pearson-blind x^2 is found."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(1500)
    cols = {"x": x, "sq": x**2 + 0.2 * rng.standard_normal(1500), "noise": rng.standard_normal(1500)}
    csv = tmp_path / "data.csv"
    np.savetxt(csv, np.column_stack(list(cols.values())), delimiter=",", header=",".join(cols), comments="")
    assert main(["matrix", str(csv), "--window", "1000"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[3:6]}
    assert float(rows["x"][1]) > 0.5 and float(rows["x"][2]) < 0.05
    png = tmp_path / "data_mi.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["matrix", str(csv), "--columns", "x", "nope"]) == 2
