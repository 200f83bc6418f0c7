"""The HTTP edge: the Starlette app, its doors (plain, KServe v2), and the one place errors
become status codes. Every door is a codec over :class:`batching.service.DataPlane`."""

from .app import ModelBuilder, create_app, default_model_builder

__all__ = ["ModelBuilder", "create_app", "default_model_builder"]
