"""The `dociq` command: one entry point for training, inference, evaluation and export.

    dociq train stage=pretrain trainer.max_steps=100     # = python train.py ... (Hydra overrides)
    dociq predict run.ckpt page.png --question "total?"  # dociq.cli.predict (dociq.inference.predictor)
    dociq segment-page run.ckpt page.png                 # dociq.cli.segment_page (dociq.inference.automatic)
    dociq segment run.ckpt docs/ --out results/          # dociq.cli.segment (dociq.inference.documents)
    dociq eval run.ckpt --pages 64                       # dociq.cli.eval (dociq.evaluation.answers)
    dociq export run.ckpt exported/                      # dociq.cli.export (dociq.inference.model_folder)
    dociq convert-checkpoint old.ckpt new.ckpt           # dociq.cli.convert_checkpoint (dociq.inference.convert)
    dociq engine import --data store/ pages/             # dociq.cli.engine (the data engine)
    dociq corpus build pdfs/ data/corpus                 # dociq.cli.corpus (real documents)
    dociq --debug predict ...                            # tracebacks instead of one-line errors

Each subcommand's arguments go to its module unchanged (`dociq predict --help` is predict's help).
A user's mistake (a missing file, a bad value: ValueError and dociq's CheckpointError,
BadSampleError, ConfigError, ...) prints `dociq <cmd>: error: <message>` on one line and exits 2;
`--debug` or DOCIQ_DEBUG=1 shows the traceback instead. `report_errors` is that handler, for the
dispatcher and for the commands' own `main(argv)` (which return 2 when called directly). Modules are imported only when their
subcommand runs, so `dociq --help` is quick and one broken module does not break the others.
`pip install dociq` installs what predict, segment-page, segment, eval and export need; a package
that only an extra installs (EXTRAS) is named in one line with its `pip install 'dociq[<extra>]'`.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    help: str
    module: str | None                       # imported when the command runs
    prefix: tuple[str, ...] = ()             # arguments put before the user's (e.g. export's "export")
    takes_debug: bool = False                # the module's own parser has --debug
    missing: str | None = None               # the error when the module is not installed
    # deferred: each command's module is imported when it runs (`dociq --help` stays quick)


COMMANDS: dict[str, Command] = {
    "train": Command("train a stage (Hydra overrides, as `python train.py`)", "dociq.training.train"),
    "predict": Command("segment a page with a fine-tuned checkpoint and prompts", "dociq.cli.predict",
                       takes_debug=True),
    "segment-page": Command("segment everything on a page (automatic mask generation)", "dociq.cli.segment_page",
                            takes_debug=True),
    "segment": Command("segment whole documents (PDFs, images, folders) into JSON, COCO, Label Studio or "
                       "docling files", "dociq.cli.segment", takes_debug=True),
    "eval": Command("score checkpoints on held-out prompts through the Predictor: synthetic pages, a real "
                    "corpus split or a COCO set; --baseline detector adds a layout-detector peer", "dociq.cli.eval"),
    "export": Command("export a checkpoint for sharing: dociq export CKPT DIR", "dociq.cli.export", prefix=("export",),
                      takes_debug=True),
    "convert-checkpoint": Command("complete the model config of a checkpoint or model folder from before "
                                  "complete configs: dociq convert-checkpoint OLD NEW",
                                  "dociq.cli.convert_checkpoint", takes_debug=True),
    "corpus": Command("real documents: fetch Debian's, build labelled shards from any PDF/HTML folder, "
                      "export COCO (dociq corpus --help)", "dociq.cli.corpus"),
    "engine": Command("the data engine: import pages, annotate, export (dociq engine --help)", "dociq.cli.engine",
                      missing="the data engine's modules (dociq.cli.engine) could not be imported; "
                              "reinstall dociq (pip install -e .)"),
}


# The packages `pip install dociq` leaves to an extra (pyproject.toml), by top-level module: the
# extras that install each, the usual one first. A command that fails on a missing one says which
# extra to install instead of printing a traceback.
EXTRAS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("lightning", "lightning_fabric", "hydra", "hydra_plugins", "omegaconf", "optuna", "wandb",
                     "tensorboard", "galore_torch", "matplotlib"), ("train",)),
    # the corpus's shards: also how `dociq eval --data corpus` reads a split
    "litdata": ("corpus", "engine", "train"),
    "pdfplumber": ("corpus",),
    "playwright": ("corpus",),
    **dict.fromkeys(("fastapi", "starlette", "uvicorn", "multipart"), ("engine",)),
    "pytesseract": ("ocr", "train", "corpus"),
    "onnxruntime": ("onnx", "baseline"),
    **dict.fromkeys(("onnx", "onnxscript"), ("export",)),
    "docling_core": ("segment",),
}


def missing_extra(name: str, err: BaseException) -> str | None:
    """`dociq <name>`'s one-line message for a ModuleNotFoundError of a package an extra installs
    (the command's own extra where it holds the package: `dociq engine` asks for 'engine'), else None."""
    if not isinstance(err, ModuleNotFoundError) or not err.name:
        return None
    module = err.name.partition(".")[0]
    extras = EXTRAS.get(module)
    if extras is None:
        return None
    extra = name if name in extras else extras[0]
    return f"{module} is not installed: dociq {name} needs the '{extra}' extra: pip install 'dociq[{extra}]'"


class UsageError(Exception):
    """A mistake in the `dociq` command line itself (not in a subcommand's arguments)."""


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version as package_version

    try:
        return package_version("dociq")
    except PackageNotFoundError:   # run from a source tree that was never installed
        return "unknown (not installed: pip install -e .)"


def build_parser() -> argparse.ArgumentParser:
    lines = [f"  {name:<13} {cmd.help}" for name, cmd in COMMANDS.items()]
    parser = argparse.ArgumentParser(
        prog="dociq", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Promptable document segmentation: train, predict, evaluate, export.",
        epilog="commands:\n" + "\n".join(lines) + "\n\n`dociq <command> --help` shows a command's options; "
               "docs/cli.md has an example of each.")
    parser.add_argument("--version", action="version", version=f"dociq {version()}")
    parser.add_argument("--debug", action="store_true",
                        help="show tracebacks instead of one-line errors (also: DOCIQ_DEBUG=1)")
    parser.add_argument("command", choices=list(COMMANDS), metavar="command",
                        help="one of: " + ", ".join(COMMANDS))
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the command's arguments")
    return parser


def debug_enabled(flag: bool) -> bool:
    return flag or os.environ.get("DOCIQ_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}


def load_main(name: str, cmd: Command) -> Callable:
    try:
        module = importlib.import_module(cmd.module)
    except ModuleNotFoundError as err:
        parts = cmd.module.split(".")
        if err.name not in {".".join(parts[:i]) for i in range(1, len(parts) + 1)}:
            raise   # the module is there but one of its own imports failed: a real error
        raise UsageError(cmd.missing or f"{cmd.module} is not part of this dociq install (yet): `dociq {name}` "
                         f"is not available; update dociq (git pull && pip install -e .)") from err
    return module.main


def run_train(args: list[str], debug: bool) -> int:
    """Hand the overrides to the Hydra entry point exactly as `python train.py ARGS` would."""
    main = load_main("train", COMMANDS["train"])
    if debug:
        os.environ["HYDRA_FULL_ERROR"] = "1"   # Hydra's own switch for the full traceback
    saved = sys.argv
    sys.argv = [saved[0], *args]
    try:
        main()
    finally:
        sys.argv = saved
    return 0


def run_module(name: str, args: list[str], debug: bool) -> int:
    cmd = COMMANDS[name]
    main = load_main(name, cmd)
    argv = [*cmd.prefix, *args]
    if debug and cmd.takes_debug and "--debug" not in argv:
        argv.append("--debug")
    saved = sys.argv[0]
    sys.argv[0] = f"dociq {name}"   # argparse's usage and error lines then name the subcommand
    try:
        code = main(argv)
    finally:
        sys.argv[0] = saved
    return int(code) if isinstance(code, int) else 0


def dispatch(name: str, args: list[str], debug: bool) -> int:
    if name == "train":
        return run_train(args, debug)
    return run_module(name, args, debug)


def one_line(err: BaseException) -> str:
    return " ".join(str(err).split()) or type(err).__name__


# CheckpointError, BadSampleError, ConfigError are ValueErrors: the user's input, not a bug
USER_ERRORS: tuple[type[BaseException], ...] = (UsageError, FileNotFoundError, ValueError)


def report_errors(name: str, run: Callable[[], int | None], debug: bool = False,
                  also: tuple[type[BaseException], ...] = ()) -> int:
    """The one error handler of the `dociq` commands: `run()`'s exit code (None: 0); a user's mistake
    (USER_ERRORS and `also`) prints `dociq <name>: error: <message>` on one line and returns 2,
    Ctrl-C returns 130. A package that only an extra installs is the same kind of one-line error,
    naming the extra. With `debug` (or DOCIQ_DEBUG=1) the error is raised with its traceback."""
    try:
        code = run()
    except (*USER_ERRORS, *also, ModuleNotFoundError) as err:
        extra = missing_extra(name, err)
        if debug_enabled(debug) or (extra is None and not isinstance(err, (*USER_ERRORS, *also))):
            raise   # any other missing module is a broken install: its traceback shows where
        print(f"dociq {name}: error: {extra or one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"dociq {name}: interrupted", file=sys.stderr)
        return 130
    return int(code) if isinstance(code, int) else 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    debug = debug_enabled(ns.debug)
    return report_errors(ns.command, lambda: dispatch(ns.command, list(ns.args), debug), debug)

