"""The text family: the transformers pipeline tasks, and zero-shot classification over an NLI
model."""
