"""The HTTP doors (plain, KServe v2), their request handling, and the one place errors become
HTTP status codes. Every door is a codec over :class:`batching.plane.DataPlane`; the app that
puts them together is :mod:`batching.app`."""
