"""`python train.py stage=pretrain` — a thin shim over dociq.train.main (Hydra)."""
from dociq.train import main

if __name__ == "__main__":
    main()
