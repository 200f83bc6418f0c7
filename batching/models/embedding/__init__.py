"""The embedding family: sentence-transformers embedders, dense and sparse (SPLADE), their
pooling, prompts, encodings and tokenisation."""
