"""`--compile` across CPU settings: PyTorch's compiler caches the code it writes (in TORCHINDUCTOR_CACHE_DIR) without
the vector width it chose by ATEN_CPU_CAPABILITY, and code written under the AVX2 setting then ran natively on a CPU
with AVX-512 out of bounds (a crash). Each width now has code of its own. Two cold compiles (35 s): kept out of CI,
run with -m slow; it can only fail on a CPU with AVX-512."""

import os
import subprocess
import sys

import pytest

COMPILED_AS_EAGER = """
import torch
from mt.config import ModelConfig
from mt.data.batches import pad
from mt.data.tokenizer import EOS
from mt.decode.search import greedy
from mt.fast.compiled import compile_decoding
from mt.fast.paths import for_inference
from mt.model.transformer import Transformer

torch.manual_seed(0)
cfg = ModelConfig(d_model=64, n_heads=4, n_enc_layers=1, n_dec_layers=2, d_ff=128, dropout=0.0, max_len=64,
                  src_vocab_size=300, tgt_vocab_size=300)
model = for_inference(Transformer(cfg).eval(), "fp32")
src = pad([[5, 6, 7, 8, 9, 10, 11]], [], [EOS])
eager = greedy(model, src, 0.0, 4, min_len=3)
compiled = greedy(compile_decoding(model), src, 0.0, 4, min_len=3)
assert [h.tokens for h in compiled] == [h.tokens for h in eager], (compiled, eager)
assert all(abs(c.logprob - e.logprob) < 1e-3 for c, e in zip(compiled, eager)), (compiled, eager)
"""


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="ATEN_CPU_CAPABILITY's x86 settings")
def test_compiled_decoding_is_right_after_another_cpu_setting_compiled_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "TORCHINDUCTOR_CACHE_DIR")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path)  # one cache for both, empty at first
    for setting in ({"ATEN_CPU_CAPABILITY": "avx2"}, {}):  # the AVX2 setting first, then the CPU as it is
        run = subprocess.run([sys.executable, "-c", COMPILED_AS_EAGER], env=env | setting, capture_output=True,
                             text=True, timeout=600)
        assert run.returncode == 0, f"{setting or 'native'}: exit {run.returncode}\n{run.stderr[-2000:]}"
