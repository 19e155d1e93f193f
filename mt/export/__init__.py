"""To other engines and back: a checkpoint written for another engine (convert), as CTranslate2 (ctranslate2) or
a Hugging Face MarianMTModel directory (huggingface); and a MarianMTModel directory, an OPUS-MT model say, read
back as an mt checkpoint (from_marian, `mt import`). Imports mt.data, mt.model and mt.decode.
"""
