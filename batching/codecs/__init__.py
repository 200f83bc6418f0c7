"""Wire formats, as pure functions over bytes, numpy and orjson: the plain text/JSON body
(:mod:`.plain`), the OpenAI embeddings and the rerank bodies (:mod:`.openai`, :mod:`.rerank`),
and a model's named inputs (:mod:`.inputs`). No web framework here, so every door can share
them."""
