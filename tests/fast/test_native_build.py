"""The C code builds cleanly wherever a compiler is, and a machine that has one and a CPU it runs on decodes in C:
these tests are never skipped there, so a C step silently lost (its tests skipped with it) fails the suite."""

import subprocess
import warnings

import pytest

import mt.fast.native_step
from mt.fast.native_step import FLAGS, SOURCES, VNNI_FLAGS, compiler, instruction_set, library
from mt.fast.paths import fast_paths, for_inference

from ..conftest import tiny_model


@pytest.mark.parametrize("flags", [FLAGS, FLAGS + VNNI_FLAGS], ids=["AVX2", "AVX-512 VNNI"])
def test_the_c_compiles_without_a_warning(flags, tmp_path):
    if not compiler():
        pytest.skip("no C compiler on this machine: decoding stays in PyTorch, as test_no_compiler_says_so checks")
    for source in SOURCES:  # compiled, not linked: either instruction set builds on any x86 machine
        built = subprocess.run([*compiler(), *[f for f in flags if f != "-shared"], "-Wall", "-Wextra", "-Werror",
                                "-c", str(source), "-o", str(tmp_path / "out.o")], capture_output=True, text=True)
        assert built.returncode == 0, built.stderr


def test_a_machine_with_a_compiler_and_avx2_decodes_in_c():
    if instruction_set() is None:
        pytest.skip("a CPU without AVX2 and FMA: no C step to build")
    assert (library() is not None) == bool(compiler()), mt.fast.native_step.unavailable()


def test_no_compiler_says_so_once_and_mt_bench_says_so(monkeypatch):
    if instruction_set() is None:
        pytest.skip("a CPU without AVX2 and FMA: no C step to build")
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", "")
    mt.fast.native_step.load.cache_clear()
    try:
        with pytest.warns(UserWarning, match=r"no C compiler \(cc, gcc or \$CC\).*decoding stays in PyTorch"):
            model = for_inference(tiny_model(), "fp32")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # said once: the answer is kept
            for_inference(tiny_model(), "fp32")
        assert "decoding step: PyTorch's, not C (no C compiler (cc, gcc or $CC))" in fast_paths(model)
    finally:
        mt.fast.native_step.load.cache_clear()
