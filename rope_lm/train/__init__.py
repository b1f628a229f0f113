"""Training: the LightningModule, the trainer and its callbacks, checkpoints, sharding, compile, loggers, the memory plan."""
