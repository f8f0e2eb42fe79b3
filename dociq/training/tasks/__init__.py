"""One LightningModule per training stage, and the registry that maps `stage.name` to it."""
