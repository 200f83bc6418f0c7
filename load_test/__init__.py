"""Load-testing tool for the batching server: ``python -m load_test --help``.

It treats the server as a black box reached over HTTP and imports nothing from ``batching``.
"""
