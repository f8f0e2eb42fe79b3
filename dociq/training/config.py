"""Config helpers shared by train.py, the tests and notebooks: resolvers and composition."""
from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

# shipped inside the package, so an installed wheel trains too; `configs/` at the repository root
# is a link to it
CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"


def _div(a, b) -> int:
    return int(a) // int(b)


def claim_run_dir(path: str) -> str:
    """Create and return `path`, or `path_1`, `path_2`, ... if it exists: a folder no other run uses.

    `os.mkdir` is atomic, so two runs started in the same second (names from `${now:...}`) get two
    folders instead of sharing one (interleaved metrics.csv, overwritten hparams.yaml)."""
    base = Path(path)
    base.parent.mkdir(parents=True, exist_ok=True)
    for i in range(10_000):
        candidate = base if i == 0 else base.with_name(f"{base.name}_{i}")
        try:
            os.mkdir(candidate)
            return str(candidate)
        except FileExistsError:
            continue
    raise RuntimeError(f"could not claim a run folder next to {base}: 10000 exist already")


def register_resolvers() -> None:
    """`${div:a,b}` integer division (e.g. the mask-unit grid = image_size // mask_unit_px);
    `${unique_dir:path}` a run folder claimed for this run (cached: one folder per config)."""
    if not OmegaConf.has_resolver("div"):
        OmegaConf.register_new_resolver("div", _div)
    if not OmegaConf.has_resolver("unique_dir"):
        OmegaConf.register_new_resolver("unique_dir", claim_run_dir, use_cache=True)


register_resolvers()


def compose(overrides: list[str] | None = None, config_name: str = "train",
            return_hydra_config: bool = False) -> DictConfig:
    """Compose the training config as `python train.py <overrides>` would (for tests and notebooks)."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name=config_name, overrides=list(overrides or []),
                            return_hydra_config=return_hydra_config)
    return cfg
