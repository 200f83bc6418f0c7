"""The batching core: the queue, batch formation, admission and the window policies.

It knows nothing of HTTP, torch, Prometheus or processes: instances are callables that run a
batch (:data:`~batching.core.jobs.RunBatch`), and what is worth counting goes to a
:class:`~batching.core.events.BatchEvents` observer.
"""
