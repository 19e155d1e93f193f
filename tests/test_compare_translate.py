"""benchmarks/compare_translate.py in this process: every system translates the same sources to the same fixed
length, and the ratio line compares mt with each (`make bench-compare` runs it as a command: tests/test_makefile.py,
-m slow)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "compare_translate.py"

spec = importlib.util.spec_from_file_location("compare_translate", SCRIPT)
compare_translate = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_translate)


@pytest.mark.parametrize("beam", [1, 4])
def test_every_system_produces_the_same_tokens_and_mt_is_compared_with_each(beam, monkeypatch, capsys):
    pytest.importorskip("ctranslate2")
    pytest.importorskip("transformers")
    monkeypatch.setattr(sys, "argv", ["compare_translate.py", "--preset", "tiny", "--beam", str(beam), "--batch", "3",
                                      "--runs", "1", "--src-len", "5", "--tgt-len", "4", "--int8", "--threads", "1"])
    compare_translate.main()
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    *timed, ratios = rows
    assert [r["system"] for r in timed] == ["mt-fp32", "mt-int8", "hf-generate-fp32", "ct2-float32", "ct2-int8"]
    assert all(r["tgt_tokens"] == 3 * 4 and r["beam"] == beam and r["tgt_tok_per_s"] > 0 for r in timed)
    over = ratios["ratios_mt_fp32_over"]
    assert set(over) == {"mt-int8", "hf-generate-fp32", "ct2-float32", "ct2-int8", "mt-int8 / ct2-int8"}
    assert all(v > 0 for v in over.values())
