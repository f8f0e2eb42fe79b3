"""Training: the Hydra entry (train.py), its callbacks, loggers, progress and config checks, the
Lightning data module, and one LightningModule per stage (tasks/). The only package that imports
Lightning (besides the optimizer's strategy in dociq.optim)."""
