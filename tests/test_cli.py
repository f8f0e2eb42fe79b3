"""The `dociq` console script (dociq/cli/__init__.py): subcommands reach their modules with the arguments
unchanged, a user's mistake is one line on stderr with exit status 2, `--debug` shows the traceback."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dociq import cli

REPO = Path(__file__).resolve().parent.parent


def _dociq(args: list[str], cwd: Path, env: dict | None = None, timeout: int = 180) -> subprocess.CompletedProcess:
    """Run the installed console script (falls back to `python -m dociq.cli` in an uninstalled tree)."""
    script = shutil.which("dociq", path=str(Path(sys.executable).parent))
    cmd = [script] if script else [sys.executable, "-m", "dociq.cli"]
    full_env = dict(os.environ, PYTHONPATH=str(REPO), DOCIQ_ROOT=str(cwd), **(env or {}))
    if "DOCIQ_DEBUG" not in (env or {}):
        full_env.pop("DOCIQ_DEBUG", None)
    return subprocess.run(cmd + args, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


def test_console_script_is_installed():
    assert shutil.which("dociq", path=str(Path(sys.executable).parent)), \
        "no `dociq` next to the interpreter: run `pip install -e . --no-deps`"


def test_help_lists_every_command_and_version(tmp_path):
    out = _dociq(["--help"], tmp_path)
    assert out.returncode == 0, out.stderr
    for name in cli.COMMANDS:
        assert f"\n  {name} " in out.stdout, name
    version = _dociq(["--version"], tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("dociq 0.")


def test_train_passes_hydra_arguments_through(tmp_path):
    out = _dociq(["train", "--cfg", "job", "stage=finetune", "trainer.max_steps=7"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    cfg = OmegaConf.create(out.stdout)
    assert cfg.stage.name == "finetune" and cfg.trainer.max_steps == 7
    assert not (tmp_path / "outputs").exists()   # --cfg composes only: no run folder


def test_bad_predict_argument_is_one_line_and_exit_2(tmp_path):
    out = _dociq(["predict", str(tmp_path / "missing.ckpt"), str(tmp_path / "missing.png"), "--question", "total?"],
                 tmp_path)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dociq predict: error: "), out.stderr
    assert "missing.png" in lines[0] and "Traceback" not in out.stderr


@pytest.mark.parametrize("how", ["flag", "env"])
def test_debug_shows_the_traceback(tmp_path, monkeypatch, how):
    """In process (the subprocess test above covers the one-line form): with --debug or
    DOCIQ_DEBUG=1 the error propagates, so Python prints its traceback."""
    from dociq.data.errors import BadSampleError

    args = ["predict", str(tmp_path / "missing.ckpt"), str(tmp_path / "missing.png"), "--question", "total?"]
    monkeypatch.delenv("DOCIQ_DEBUG", raising=False)
    if how == "env":
        monkeypatch.setenv("DOCIQ_DEBUG", "1")
    with pytest.raises(BadSampleError, match="missing.png"):
        cli.main(["--debug", *args] if how == "flag" else args)


def test_engine_without_a_command_is_a_usage_error(tmp_path):
    out = _dociq(["engine"], tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("dociq engine: error: ")


def test_engine_not_installed_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "dociq.cli.engine", None)   # import fails as if the file were missing
    assert cli.main(["engine", "import", "--data", "store", "pages"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "dociq engine: error: the data engine's modules (dociq.cli.engine) could not be imported; "
        "reinstall dociq (pip install -e .)"]


def test_engine_reaches_the_engine_cli(capsys):
    pytest.importorskip("dociq.cli.engine")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["engine", "--help"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("usage: dociq engine")


def test_unknown_command_names_the_choices(tmp_path):
    out = _dociq(["trian"], tmp_path)
    assert out.returncode == 2 and "invalid choice: 'trian'" in out.stderr and "train" in out.stderr


# ---- in process: dispatch details ------------------------------------------------------------

def test_subcommand_help_is_the_module_help_under_the_dociq_name(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["predict", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: dociq predict") and "--question" in out
    assert sys.argv[0] != "dociq predict"   # restored


def test_the_eval_summary_names_what_eval_scores(capsys):
    """`dociq --help`'s line for eval names every page source of `dociq eval --data`, the Predictor
    it scores and the baseline it can add."""
    from dociq.cli.eval import BASELINES, build_parser

    with pytest.raises(SystemExit):
        cli.main(["--help"])
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("  eval ")]
    (data,) = [a for a in build_parser()._actions if a.dest == "data"]
    for word in (*data.choices, "Predictor", *(f"--baseline {b}" for b in BASELINES)):
        assert word.lower() in line.lower(), word


def test_a_module_that_is_not_there_is_a_one_line_error(monkeypatch, capsys):
    monkeypatch.setitem(cli.COMMANDS, "export", cli.Command("export", "dociq.not_written_yet", ("export",)))
    assert cli.main(["export", "a.ckpt", "out"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dociq export: error: dociq.not_written_yet is not part")


def test_export_prefixes_the_export_subcommand_and_forwards_debug(monkeypatch):
    seen = []

    class FakeModule:
        @staticmethod
        def main(argv):
            seen.append(list(argv))
            return 0

    monkeypatch.setitem(sys.modules, "dociq.fake_export", FakeModule)
    monkeypatch.setitem(cli.COMMANDS, "export", cli.Command("export", "dociq.fake_export", ("export",), takes_debug=True))
    assert cli.main(["export", "run.ckpt", "folder"]) == 0
    assert cli.main(["--debug", "export", "run.ckpt", "folder"]) == 0
    assert seen == [["export", "run.ckpt", "folder"], ["export", "run.ckpt", "folder", "--debug"]]


def test_value_errors_from_a_module_are_one_line_unless_debug(monkeypatch, capsys):
    from dociq.training.config_checks import ConfigError

    class Failing:
        @staticmethod
        def main(argv):
            raise ConfigError("trainer.max_steps=abc must be\na positive integer")

    monkeypatch.setitem(sys.modules, "dociq.fake_failing", Failing)
    monkeypatch.setitem(cli.COMMANDS, "eval", cli.Command("eval", "dociq.fake_failing"))
    monkeypatch.delenv("DOCIQ_DEBUG", raising=False)
    assert cli.main(["eval"]) == 2
    assert capsys.readouterr().err == "dociq eval: error: trainer.max_steps=abc must be a positive integer\n"
    with pytest.raises(ConfigError):
        cli.main(["--debug", "eval"])


def test_a_missing_dependency_inside_a_module_is_not_hidden(tmp_path, monkeypatch):
    """Only the subcommand's own module being absent is "not available"; a module that is there but
    fails to import one of its dependencies raises, so the real cause is shown."""
    (tmp_path / "dociq_broken_cmd.py").write_text("import a_dependency_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.COMMANDS, "eval", cli.Command("eval", "dociq_broken_cmd"))
    with pytest.raises(ModuleNotFoundError, match="a_dependency_that_is_not_installed"):
        cli.main(["eval"])
