"""Leaving mt: a checkpoint written for another engine (convert), as CTranslate2 (ctranslate2) or a Hugging
Face MarianMTModel directory (huggingface). Imports mt.data, mt.model and mt.decode.
"""
