"""The runtime: deployments (one served model each), their thread and process instances,
warm-up, and the supervision that restarts an instance that died."""
