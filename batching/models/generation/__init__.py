"""The generation family: the generating tasks' model (causal and encoder-decoder), their running
batches in the iteration-level decode loop, sampling, chats and the generation settings."""
