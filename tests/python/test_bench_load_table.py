"""scripts/bench.py renders scripts/bench-load.py's figures (issue 25): one
row per case with the idle and the loaded timings side by side, the target
marked on the loaded ratio; other benches keep their plain rows."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


def _load(name, file):
    sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _recorded(tmp_path, monkeypatch):
    """Rows as the benches record them, through bench_common.record."""
    common = _load("bench_common", "bench_common.py")
    results = tmp_path / "figures.jsonl"
    monkeypatch.setenv("FERRITE_BENCH_JSON", str(results))
    common.record("Python call overhead (vs iree.runtime)", "4xf32 add", 3.0, 6.0, "us/call", 0.5)
    area = "busy machine, idle and with 16 busy processes (vs iree-benchmark-module)"
    common.record(area, "mlp/local-task", 47.6, 51.5, "us/call", 1.0, loaded=(120.0, 133.0))
    common.record(area, "minilm/local-task", 9640.0, 9840.0, "us/call", 1.0, loaded=(21500.0, 15900.0))
    common.record(area, "add/local-sync", 1.9, 3.8, "us/call", loaded=(3.9, 3.3))
    return results


def test_load_rows_render_idle_and_loaded_side_by_side(tmp_path, monkeypatch):
    results = _recorded(tmp_path, monkeypatch)
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert rows[1]["loaded_ratio"] == 120.0 / 133.0
    assert "loaded_ferrite" not in rows[0]
    text = _load("bench", "bench.py").table(rows)
    lines = text.splitlines()
    # The plain area keeps its columns.
    assert "| 4xf32 add | 3.00 | 6.00 | us/call | **0.50** | ≤ 0.5 |  |" in lines
    # The load area: both column groups, one row per case.
    assert ("| case | idle Ferrite | idle upstream | idle ratio | loaded Ferrite | loaded upstream | "
            "loaded ratio | unit | target (loaded) | notes |") in lines
    # Target met under load: bold; missed: plain; none: no mark.
    assert "| mlp/local-task | 47.6 | 51.5 | 0.92 | 120 | 133 | **0.90** | us/call | ≤ 1.0 |  |" in lines
    assert ("| minilm/local-task | 9,640 | 9,840 | 0.98 | 21,500 | 15,900 | 1.35 | us/call | ≤ 1.0 |  |"
            in lines)
    assert "| add/local-sync | 1.90 | 3.80 | 0.50 | 3.90 | 3.30 | 1.18 | us/call |  |  |" in lines


def test_render_prints_a_recorded_file(tmp_path, monkeypatch):
    results = _recorded(tmp_path, monkeypatch)
    out = subprocess.run([sys.executable, str(SCRIPTS / "bench.py"), "--render", str(results)],
                         capture_output=True, text=True, check=True).stdout
    assert "**busy machine, idle and with 16 busy processes (vs iree-benchmark-module)**" in out
    assert "| mlp/local-task | 47.6 | 51.5 | 0.92 | 120 | 133 | **0.90** |" in out
