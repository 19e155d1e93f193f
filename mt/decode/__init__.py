"""Piece ids in, translations out: greedy and beam search over the KV cache (search), a checkpoint loaded into a model
that decodes (load), text in and out (translate), documents in and out (documents, and markup for HTML), several
models as one (ensemble), reranking (rerank), forced decoding of given translations (forced), attention weights and
alignments (alignments), CTranslate2 exports behind mt's own commands (ctranslate2), sacreBLEU scores (evaluate),
choosing beam and length penalty on valid (tune), and glossaries (glossary) with the constraints their search
honours (constrained). Imports mt.data and mt.model, never mt.train.
"""
