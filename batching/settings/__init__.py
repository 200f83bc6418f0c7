"""Settings: the command line (every flag with a ``BATCHING_*`` twin) and the model repository,
read once at start-up into validated configuration values."""
