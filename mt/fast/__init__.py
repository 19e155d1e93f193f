"""The fast paths: faster kernels swapped into the plain model of mt/model/transformer.py, for training and for
decoding, through two entry points in mt/fast/paths.py.

`for_training(model)` and `for_inference(model, precision)` each swap layers or kernels of a built model in place
and return it; parameters and state dict stay those of the plain model, so checkpoints are the same either way.
Each path runs on a model only where its contract (mt/fast/contract.py) accepts every feature of the model's config,
and otherwise declines (`declined` says why); inside a model it keeps to where it is the faster kernel (mostly fp32
on CPU, outside autocast and torch.compile) and runs the plain kernel everywhere else. tests/fast/test_contract.py
checks each one against the plain model over every config feature; docs/performance.md tells what each one gains.

The rooms, one a kernel or a kind of layer:
- training: linear.py (`Linear`, fp32 matmuls on the faster of MKL and oneDNN), dropout.py (masks from 16-bit
  integers), attention.py (`cpu_training_attention`), loss.py (the output layer and the loss fused), packed.py (the
  layers on a batch's real tokens only);
- decoding: frozen.py (`FrozenLinear`, weights stored transposed or packed for oneDNN; int8), attention.py
  (`matmul_attention` in decoding steps), compiled.py (`--compile`), native_step.py with native_layout.py,
  native_step.c and native_search.c (the decoding step and the encoder in C for a few rows, fp32 or int8),
  row_max.py (each row's best token for greedy search, by blocks where that is the faster).

Switches (environment variables):
- `MT_FAST=0` turns every fast path off: `for_training` returns the plain model, and `for_inference` only
  quantizes to int8, with PyTorch's own layers, when that precision is asked for. `MT_FAST=1` (the default) turns
  them on.
- `MT_NATIVE=0` keeps decoding in PyTorch, without the C step.
- `MT_CPU_MATMUL=mkl|onednn|auto` chooses the fp32 CPU matmul kernel of the fast linears (see mt/fast/linear.py).

Imports mt.model and mt.data and the top-level foundations, nothing above.
"""
