import pytest
import torch

from mt import device as device_module
from mt.device import autocast, autocast_dtype, pick_device
from mt.errors import MtError


@pytest.mark.parametrize("native", [True, False])
def test_auto_precision_on_a_cpu_is_bf16_only_where_it_multiplies_bf16_in_hardware(monkeypatch, native):
    monkeypatch.setattr(device_module, "native_bf16", lambda: native)
    cpu = torch.device("cpu")
    assert autocast_dtype("auto", cpu) is (torch.bfloat16 if native else None)
    assert autocast_dtype("fp32", cpu) is None and autocast_dtype("bf16", cpu) is torch.bfloat16


def test_fp16_runs_on_a_cpu_so_the_gpus_fp16_path_can_be_tested_anywhere():
    cpu = torch.device("cpu")
    assert autocast_dtype("fp16", cpu) is torch.float16
    with autocast(torch.float16, cpu):
        assert (torch.ones(2, 3) @ torch.ones(3, 2)).dtype == torch.float16
    with autocast(None, cpu):
        assert (torch.ones(2, 3) @ torch.ones(3, 2)).dtype == torch.float32


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_auto_is_the_cpu_without_a_gpu_and_asking_for_cuda_is_a_clear_error():
    assert pick_device("auto") == torch.device("cpu")
    with pytest.raises(MtError, match="no CUDA device is visible; use auto or cpu"):
        pick_device("cuda")


@pytest.mark.parametrize("flags, capability, isa_cap, native", [
    ("avx2 avx512f avx512_bf16", "AVX512", "", True),
    ("avx2 amx_bf16 avx512f", "AVX512", "", True),
    ("avx2 avx512f", "AVX512", "", False),  # AVX-512 without BF16: oneDNN emulates bf16
    ("avx2 avx512f avx512_bf16", "AVX2", "", False),  # ATEN_CPU_CAPABILITY=avx2: choose as an AVX2 CPU would
    ("avx2 avx512f avx512_bf16", "AVX512", "avx2", False),  # ONEDNN_MAX_CPU_ISA=AVX2 likewise
    ("avx2 avx512f avx512_bf16", "AVX512", "AVX512_CORE_BF16", True),
])
def test_bf16_counts_as_native_only_where_the_cpu_and_the_isa_caps_allow_it(monkeypatch, flags, capability,
                                                                             isa_cap, native):
    monkeypatch.setattr(device_module, "cpuinfo", lambda field: flags if field == "flags" else "")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa_cap)
    assert device_module.native_bf16() is native


def test_on_a_gpu_attention_never_takes_cudnns_kernel_which_plans_anew_for_every_shape():
    from torch.nn.attention import SDPBackend

    from mt.device import attention_backends, attention_kernels, pad_multiple

    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    assert SDPBackend.CUDNN_ATTENTION not in attention_backends(gpu)
    assert SDPBackend.FLASH_ATTENTION in attention_backends(gpu)
    assert attention_backends(cpu) is None  # PyTorch's choice
    with attention_kernels(gpu):  # the flags a training or decoding step runs under on a GPU
        assert not torch.backends.cuda.cudnn_sdp_enabled() and torch.backends.cuda.flash_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() or not torch.backends.cuda.is_built()  # restored after
    assert (pad_multiple(gpu), pad_multiple(cpu)) == (8, 1)
