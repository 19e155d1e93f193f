"""The Transformer as the paper has it (transformer) and its decoding cache (cache). The fast paths that are swapped
into it live in mt/fast/. Imports mt.data (the tokenizer's special ids) and the top-level foundations, nothing above.
"""
