"""Config helpers shared by train.py, the tests and notebooks: resolvers and composition."""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


def _div(a, b) -> int:
    return int(a) // int(b)


def register_resolvers() -> None:
    """`${div:a,b}` integer division (e.g. the mask-unit grid = image_size // mask_unit_px)."""
    if not OmegaConf.has_resolver("div"):
        OmegaConf.register_new_resolver("div", _div)


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
