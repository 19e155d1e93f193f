"""Text to ids: reading and writing text files (lines), finding parallel corpora (corpus), cleaning pairs
(clean), SentencePiece (tokenizer; a model's pieces reordered, spm_proto), building a prepared directory
(prepare), token ids on disk, memory-mapped (ids), and cutting them into token-budget batches (batches). Imports
only mt's top-level foundations (config, errors); nothing here knows about models.
"""
