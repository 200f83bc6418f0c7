"""The KServe v2 inference protocol, independent of its transport: tensors and their JSON and
binary forms (:mod:`.tensors`, :mod:`.request`, :mod:`.response`), what the protocol says about
the server and its models (:mod:`.describe`), and what an infer request means for a deployment
(:mod:`.infer`). The HTTP door (and any other) is a thin layer over it."""
