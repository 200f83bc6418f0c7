"""Tests of the load-testing tool itself (``load_test``), one module per ``load_test`` module.

Pure parts (statistics, the open-loop schedule, the Prometheus parser, payloads, the
self-checks, process readings) are tested on their own; the commands end to end against
:mod:`tests.support.fake_server`, in-process for ``run`` and as a subprocess for the
experiments that start their own server.
"""
