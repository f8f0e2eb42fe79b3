"""The Hydra config tree composes for every stage, and mistakes fail with a message naming the key."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from dociq.training.config import compose
from dociq.training.tasks.registry import STAGES, resolve_stage

GROUPS = ("stage", "model", "data", "optim", "trainer", "logger", "callbacks", "paths",
          "experiment", "hparams_search")


def test_every_config_group_exists(repo_root):
    for group in GROUPS:
        assert (repo_root / "configs" / group).is_dir(), group


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_each_registered_stage_has_a_config_that_composes(stage, repo_root):
    if not (repo_root / "configs" / "stage" / f"{stage}.yaml").exists():
        pytest.skip(f"stage {stage} has no config yet")
    cfg = compose([f"stage={stage}"])
    assert cfg.stage.name == stage
    OmegaConf.resolve(cfg)  # every interpolation resolves
    assert cfg.task.model.size == "tiny"
    assert cfg.data.image_size == cfg.model.image_size


def test_default_stage_is_the_main_job():
    cfg = compose([])
    assert cfg.stage.name == "pretrain"
    assert cfg.model.size == "tiny" and cfg.trainer.accelerator == "cpu"


def test_misspelt_override_names_the_key():
    with pytest.raises(ConfigCompositionException, match="max_stepz"):
        compose(["trainer.max_stepz=3"])


def test_unknown_stage_names_the_choices():
    with pytest.raises(KeyError, match="choose one of: distill, finetune, ijepa, mlm, pretrain"):
        resolve_stage("pretrian")


def test_cli_prints_the_composed_config(repo_root):
    out = subprocess.run([sys.executable, "train.py", "--cfg", "job", "stage=pretrain"], cwd=repo_root,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    cfg = OmegaConf.create(out.stdout)
    assert cfg.stage.name == "pretrain" and "task" in cfg and "optim" in cfg


def test_cli_misspelt_override_fails_naming_the_key(repo_root):
    out = subprocess.run([sys.executable, "train.py", "stage=pretrain", "trainer.max_stepz=3"],
                         cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "max_stepz" in out.stderr


def test_the_make_finetune_stages_compose(repo_root, tmp_path):
    """`make finetune`'s two train.py commands, as make would run them, compose: pretraining at
    256 px, fine-tuning at FINETUNE_SIZE (384 by default, 256 for the cheaper run) with the loss
    grid following it."""
    import shlex
    import shutil

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    (tmp_path / "corpus.json").write_text("{}")          # a built corpus: make must not build one
    for extra, size in (([], 384), (["FINETUNE_SIZE=256"], 256)):
        dry = subprocess.run(["make", "-n", "-o", ".venv/.installed", "finetune", "RUN=t", f"CORPUS={tmp_path}",
                              *extra], cwd=repo_root, capture_output=True, text=True, check=True).stdout
        commands = [shlex.split(line) for line in dry.replace("\\\n", " ").splitlines() if "train.py" in line]
        assert [c[c.index("train.py") + 1] for c in commands] == ["stage=pretrain", "stage=finetune"]
        pretrain, finetune = (compose(c[c.index("train.py") + 1:]) for c in commands)
        assert pretrain.model.image_size == 256
        assert "MixedDocuments" in pretrain.data.train_set._target_
        assert "MixedDocuments" in finetune.data.train_set._target_
        assert finetune.model.image_size == size and finetune.data.image_size == size
        assert OmegaConf.select(finetune, "task.loss_size") == size // 4
        assert finetune.trainer.max_steps == 1200
        # synthetic pages are drawn at 256 px at every input size (the collator resizes them)
        assert [d.image_size for d in finetune.data.train_set.datasets if "Synthetic" in d._target_] == [256]


def _corpus_roots(cfg) -> set[Path]:
    """Every corpus folder a composed config's data sets read (train and val)."""
    data = cfg.data
    sets = [*data.train_set.get("datasets", [data.train_set]), data.val_set]
    return {Path(s.root) for s in sets if "CorpusDocuments" in s._target_}


@pytest.mark.parametrize("root, corpus", [(True, None), (False, None), (True, "elsewhere/corpus")])
def test_make_finetune_trains_on_the_corpus_it_builds(repo_root, tmp_path, monkeypatch, root, corpus):
    """With or without DOCIQ_ROOT, and with CORPUS=... given, the folder `make finetune` builds its
    corpus into is the one both stages read; without CORPUS it is also the configs' own default
    (paths.corpus_dir), so `python train.py data=corpus` after `make corpus` reads it too."""
    import shlex
    import shutil

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("DOCIQ_ROOT", "MAKEFLAGS", "MAKELEVEL")}
    if root:
        env["DOCIQ_ROOT"] = str(tmp_path / "root")
        monkeypatch.setenv("DOCIQ_ROOT", env["DOCIQ_ROOT"])
    else:
        monkeypatch.delenv("DOCIQ_ROOT", raising=False)
    extra = [f"CORPUS={tmp_path / corpus}"] if corpus else []
    # no corpus.json under tmp_path: the dry run shows the build (unless the checkout built it), then both stages
    dry = subprocess.run(["make", "-n", "-o", ".venv/.installed", "finetune", "RUN=t", *extra], cwd=repo_root,
                         env=env, capture_output=True, text=True, check=True).stdout
    commands = [line for line in dry.replace("\\\n", " ").splitlines() if line.split()[:1]
                and line.split()[0].endswith("python")]         # not the recipes' comments
    lines = [shlex.split(line) for line in commands if "train.py" in line or "corpus build" in line]
    builds = [c for c in lines if "build" in c]
    built = tmp_path / corpus if corpus else tmp_path / "root" / "data" / "corpus" if root else Path("data/corpus")
    if (repo_root / built / "corpus.json").exists():              # a checkout that built it already
        assert builds == []
    else:
        (build,) = builds
        assert Path(build[build.index("build") + 2]) == built
    stages = [c[c.index("train.py") + 1:] for c in lines if "train.py" in c]
    assert [s[0] for s in stages] == ["stage=pretrain", "stage=finetune"]
    for stage in stages:
        assert _corpus_roots(compose(stage)) == {built}
    if not corpus:
        assert _corpus_roots(compose(["data=corpus"])) == _corpus_roots(compose(["data=corpus_mixed"])) == {built}
