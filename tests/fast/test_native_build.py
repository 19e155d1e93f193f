"""The C code builds cleanly wherever a compiler is, and a machine that has one and a CPU it runs on decodes in C:
these tests are never skipped there, so a C step silently lost (its tests skipped with it) fails the suite."""

import os
import subprocess
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest

import mt.errors
import mt.fast.native_step
from mt.fast.native_step import (
    FLAGS,
    SOURCES,
    VNNI_FLAGS,
    NativeDecodeStep,
    NativeEncode,
    compiler,
    instruction_set,
    library,
)
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


# Building and loading the library, switching it off: no numbers, so not in make test's AVX2 pass (-m numerics)
needs_library = pytest.mark.skipif(library() is None, reason="no C compiler, or a CPU without AVX2 and FMA")


@needs_library
def test_threads_loading_at_once_compile_it_once(monkeypatch, tmp_path):
    monkeypatch.setenv("MT_CACHE", str(tmp_path))
    mt.fast.native_step.load.cache_clear()
    try:
        with ThreadPoolExecutor(4) as pool:
            libraries = list(pool.map(lambda _: library(), range(4)))
        assert libraries[0] is not None and all(lib is libraries[0] for lib in libraries)
        assert [p.suffix for p in (tmp_path / "native").iterdir()] == [".so"]
    finally:
        mt.fast.native_step.load.cache_clear()


@needs_library
def test_building_a_library_removes_those_built_long_ago(monkeypatch, tmp_path):
    folder = tmp_path / "native"
    folder.mkdir()
    old, recent, other = (folder / name for name in ("native_step-old.so", "native_step-recent.so", "notes.txt"))
    for path in (old, recent, other):
        path.write_bytes(b"x")
    month_ago = time.time() - 31 * 86400
    for path in (old, other):
        os.utime(path, (month_ago, month_ago))
    monkeypatch.setenv("MT_CACHE", str(tmp_path))
    mt.fast.native_step.load.cache_clear()
    try:
        assert library() is not None
    finally:
        mt.fast.native_step.load.cache_clear()
    assert not old.exists() and recent.exists() and other.exists()
    assert len(list(folder.glob("native_step-*.so"))) == 2  # the one just built, and the recent one


@needs_library
def test_switched_off(monkeypatch):
    assert not isinstance(for_inference(tiny_model(), "bf16").decode_step, NativeDecodeStep)
    monkeypatch.setenv("MT_NATIVE", "0")
    plain = for_inference(tiny_model(), "fp32")
    assert not isinstance(plain.decode_step, NativeDecodeStep) and not isinstance(plain.encode, NativeEncode)
    monkeypatch.setenv("MT_NATIVE", "2")
    with pytest.raises(mt.errors.MtError, match="MT_NATIVE"):
        mt.fast.native_step.enabled()


@needs_library
def test_without_a_working_compiler_decoding_stays_in_pytorch(monkeypatch, tmp_path):
    monkeypatch.setenv("CC", "false")  # a compiler that fails
    monkeypatch.setenv("MT_CACHE", str(tmp_path))
    mt.fast.native_step.load.cache_clear()
    try:
        with pytest.warns(UserWarning, match="decoding stays in PyTorch"):
            model = for_inference(tiny_model(), "fp32")
        assert not isinstance(model.decode_step, NativeDecodeStep)
        assert not list((tmp_path / "native").iterdir())  # no half-written library left behind
    finally:
        mt.fast.native_step.load.cache_clear()


@needs_library
def test_a_compiler_without_openmp_still_builds_the_c_step(monkeypatch, tmp_path):
    """Without OpenMP (clang with no libomp, say) a step's shards run one after another, the same numbers."""
    cc = tmp_path / "cc"
    cc.write_text(f'#!/bin/sh\nfor a; do [ "$a" = -fopenmp ] && exit 1; done\nexec {" ".join(compiler())} "$@"\n')
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("MT_CACHE", str(tmp_path / "cache"))
    mt.fast.native_step.load.cache_clear()
    try:
        assert library() is not None
        assert len(list((tmp_path / "cache" / "native").glob("*.so"))) == 1
    finally:
        mt.fast.native_step.load.cache_clear()


@needs_library
def test_the_c_step_s_shards_run_on_pytorch_s_own_openmp():
    """One OpenMP runtime in the process: a second one's threads would wait for cores beside PyTorch's."""
    library()
    with open("/proc/self/maps") as f:
        runtimes = {line.split()[-1] for line in f if line.rstrip().endswith("/libgomp.so.1")}
    assert len(runtimes) == 1, runtimes
