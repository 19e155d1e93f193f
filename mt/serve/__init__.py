"""`mt serve`: the HTTP app and mt's own API (app), the way a request is translated (translating), its texts cut
into the parts the model takes and put back together, its work bounded (parts), requests batched across clients
(batcher), LibreTranslate's request shapes (libretranslate) and routes (libretranslate_routes,
file_routes), languages detected (detect), translated files kept for download (files), each request judged alone
(checks), every refusal shaped `{"error"}` (errors), slow clients dropped (limits), Prometheus metrics (metrics)
and the page (static/). Imports mt.data, mt.model, mt.decode and mt.documents.
"""
