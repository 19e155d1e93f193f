"""`mt serve`: the HTTP app (app), requests batched across clients (batcher), LibreTranslate's request shapes
(libretranslate), each request judged alone (checks), every refusal shaped `{"error"}` (errors), slow clients
dropped (limits), Prometheus metrics (metrics) and the page (static/). Imports mt.data, mt.model and
mt.decode.
"""
