"""The Transformer as the paper has it (transformer), its decoding cache (cache), and the CPU fast paths swapped
in from outside (fast, with its kernels fast_linear, fast_dropout and fast_loss; `MT_FAST=0` turns them off).
Imports mt.data (the tokenizer's special ids) and the top-level foundations, nothing above.
"""
