"""Wire formats, as pure functions over bytes, numpy and orjson: the plain text/JSON body and
the KServe v2 tensors (JSON and binary). No web framework here, so every door can share them."""
