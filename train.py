"""`python train.py stage=pretrain` — a thin shim over dociq.training.train.main (Hydra)."""
from dociq.training.train import main

if __name__ == "__main__":
    main()
