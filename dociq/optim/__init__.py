"""Optimizers: SubspaceNGD (sngd.py) with its projectors, DDP hook and Lightning strategies,
and the factories that configs/optim/*.yaml instantiate (factory.py).

Importing `dociq.optim.strategy` registers the `sngd` / `sngd_ddp` Lightning strategies.
"""
from dociq.optim.sngd import SubspaceNGD

__all__ = ["SubspaceNGD"]
