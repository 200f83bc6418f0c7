"""One model loads at a time, process-wide.

The libraries a model loads through import their parts lazily on first use, and those imports
are not safe to run side by side: transformers' lazy module, asked for ``AutoModel`` on one
thread while another thread is importing ``transformers.pipelines``, can hand back a module
that is still half initialised (``module 'transformers' has no attribute 'AutoModel'``), and
tokenizers, ONNX Runtime and OpenVINO build process-wide state on first use too. A repository
of several models loads each on its own instance thread, so without an order the start fails
or not by timing alone.

:data:`LOADING` orders them: whatever builds or loads a model (constructing it, its ``load``,
its warm-up batches, an engine measured again and swapped in) holds it. Serving never does:
batches of models already loaded run beside a load. Loading one after another costs little
on top: the loads are CPU-bound, and an engine's timings taken while another model loads on
the same cores would be wrong anyway.
"""

from __future__ import annotations

import threading

__all__ = ["LOADING"]

#: Held while a model is built, loaded and warmed up, or its engine choice swapped. Reentrant,
#: so a load that builds a part through a path that also takes it does not wait on itself.
LOADING = threading.RLock()
