"""Old import paths of modules that moved in the package regroup keep working for one release.

`import dociq.predict` returns `dociq.inference.predictor` itself (one module object, so classes
and isinstance checks are shared) and warns once with the new path.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

# old module (or package prefix) -> new one
MOVED = {
    "dociq.predict": "dociq.inference.predictor",
    "dociq.automatic": "dociq.inference.automatic",
    "dociq.hub": "dociq.inference.hub",
    "dociq.evaluate": "dociq.evaluation.heldout",
    "dociq.coco_eval": "dociq.evaluation.coco_map",
    "dociq.probe": "dociq.training.probe",
    "dociq.evaluation.probe": "dociq.training.probe",
    "dociq.train": "dociq.training.train",
    "dociq.callbacks": "dociq.training.callbacks",
    "dociq.loggers": "dociq.training.loggers",
    "dociq.progress": "dociq.training.progress",
    "dociq.config": "dociq.training.config",
    "dociq.config_checks": "dociq.training.config_checks",
    "dociq.track": "dociq.io.track",
    "dociq.tasks.checkpoint_io": "dociq.io.checkpoint",
    "dociq.tasks": "dociq.training.tasks",
    "dociq.data.coco": "dociq.data.datasets.coco",
    "dociq.data.funsd": "dociq.data.datasets.funsd",
    "dociq.data.corpus.cli": "dociq.cli.corpus",
    "dociq.data.corpus": "dociq.data.datasets.corpus",
    "dociq.data.datamodule": "dociq.training.datamodule",
    "dociq.data.synthetic_content": "dociq.data.synthetic.content",
    "dociq.data.synthetic_draft": "dociq.data.synthetic.draft",
    "dociq.data.synthetic_fonts": "dociq.data.synthetic.fonts",
    "dociq.data.synthetic_layout": "dociq.data.synthetic.layout",
    "dociq.data.synthetic_questions": "dociq.data.synthetic.questions",
    "dociq.data.synthetic_render": "dociq.data.synthetic.render",
    "dociq.models.predictor": "dociq.models.jepa_predictor",
    "dociq.models.dociq": "dociq.models.document_model",
    "dociq.engine.cli": "dociq.cli.engine",
    "dociq.models.text_blocks": "dociq.data.text_blocks",
}


def new_name(old: str) -> str | None:
    """The module's new dotted name, for a moved module or anything inside a moved package."""
    if old in MOVED:
        return MOVED[old]
    for prefix, target in MOVED.items():
        if old.startswith(prefix + "."):
            return target + old[len(prefix):]
    return None


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old dotted name to the moved module (placed first on `sys.meta_path`, so the
    new package's own files are never loaded a second time under the old name)."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("dociq.") or new_name(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        target = new_name(spec.name)
        warnings.warn(f"{spec.name} moved to {target}; import it from there (the old path goes in the "
                      "next release)", FutureWarning, stacklevel=3)
        module = importlib.import_module(target)
        spec.loader_state = module.__spec__   # the import system is about to stamp `spec` on the module
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = module.__spec__.loader_state   # the real module's own spec back


def install() -> None:
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
