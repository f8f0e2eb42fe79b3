"""Does pretraining pay downstream? The recipe's fine-tuning from the pretrained checkpoint against the
same fine-tuning from the encoders' own initialisation, judged on held-out real pages.

    python scripts/eval_pretraining.py --json docs/eval_pretraining.json \
        --pretrain-ckpt 'outputs/pretrain/runs/real_s{seed}/checkpoints/last.ckpt' --probe

Each arm is INIT or INIT/REGIME:
  INIT    pretrained  `init.from=` the stage=pretrain checkpoint of the seed (--pretrain-ckpt, or a
                      `stage=pretrain data=corpus_mixed` run of --pretrain-steps in --workdir)
          random      `init.from=null`: the encoders' own initialisation (MiniLM's text encoder weights
                      where the model config loads them, random Hiera and fusion)
          no_djepa, no_mlm, no_mim   pretrained with that loss switched off (task.loss.X=0), same budget
  REGIME  full (default)    the recipe: `stage=finetune data=corpus_mixed`, --steps steps
          quarter           a quarter of the steps (the schedule ends at the quarter)
          quarter-labels    every step, a quarter of the corpus's labelled training pages
                            (synthetic pages unchanged: their labels cost nothing)
          labels-N          every step, N labelled real training pages (spread over documents)
          genre             every step, no labelled page of --genre-package; scored on that
                            package's held-out pages only (a genre fine-tuning never saw labelled)
Every run is `dociq.training.train.train(compose(overrides))`, i.e. `python train.py <overrides>`,
into --workdir/<init>[-<regime>]_s<seed>. A run whose last.ckpt has reached its steps is reused; a
shorter one resumes from it (exact: docs/reliability.md); `--run ARM:SEED=DIR` reuses a run made
elsewhere, resumed in its folder if short (its overrides must be the arm's: the JSON records them).

Every checkpoint is evaluated as `dociq eval` evaluates it: through the Predictor a user runs, with
its default settings, page by page, masks scored at the page's size (dociq.evaluation.answers), on
the corpus's held-out split (documents no training page comes from): questions (mIoU per kind), the
same with the words removed, box -> region and click -> region. The result is cached beside the
checkpoint (eval_real.json).

The JSON has per run and per arm (mean over seeds) the numbers, and the differences in mIoU points
on held-out real layout + reading questions (prompt-weighted), mean over seeds:
  pretrained_minus_random (= pretrained_minus_random_labels_all), pretrained_minus_random_<regime>
  (quarter, quarter_labels, labels_50, ...), pretrained_minus_random_unseen_genre,
  <ablation>_minus_pretrained[_<regime>]
--jobs N trains N fine-tuning runs at a time (each `python train.py` in its own process, the cores
shared among them) and evaluates N checkpoints at a time: for a GPU, where one run leaves it idle.
--probe adds the unit-class linear probe (scripts/probe_encoder.py) of each seed's pretrained image
encoder, its EMA target and a random one, on real corpus pages; and the pretraining runs' held-out
MLM accuracy and D-JEPA `unexplained` curves are read from their metrics.csv.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_segment import run_stage  # noqa: E402
from probe_encoder import load_encoder  # noqa: E402

INITS = ("pretrained", "random", "no_djepa", "no_mlm", "no_mim")
# (share of --steps, labelled real training pages: None all, a float a share, an int a count)
REGIMES = {"full": (1.0, None), "quarter": (0.25, None), "quarter-labels": (1.0, 0.25), "genre": (1.0, None)}
LABELS_N = re.compile(r"^labels-([1-9][0-9]*)$")
PROMPT_SETS = ("question", "question_no_ocr", "box_region", "point_region")
SUMMARY_KEYS = ("layout_reading", "layout", "reading", "layout_reading_no_ocr", "box_region", "point_region")


def regime_spec(regime: str) -> tuple[float, float | int | None]:
    """(share of the steps, labelled real pages) of a regime name."""
    if regime in REGIMES:
        return REGIMES[regime]
    match = LABELS_N.match(regime)
    if match is None:
        raise ValueError(f"regime {regime!r}: use one of {tuple(REGIMES)} or labels-N (N >= 1)")
    return 1.0, int(match.group(1))


def parse_arm(arm: str) -> tuple[str, str]:
    init, _, regime = arm.partition("/")
    regime = regime or "full"
    if init not in INITS:
        raise ValueError(f"arm {arm!r}: give INIT or INIT/REGIME with INIT in {INITS}")
    try:
        regime_spec(regime)
    except ValueError as err:
        raise ValueError(f"arm {arm!r}: {err}") from None
    return init, regime


def regime_suffix(regime: str) -> str:
    """The suffix of a regime's differences in the JSON: '' for the full recipe."""
    return {"full": "", "genre": "_unseen_genre"}.get(regime, "_" + regime.replace("-", "_"))


def arm_name(init: str, regime: str) -> str:
    return init if regime == "full" else f"{init}/{regime}"


def layout_reading(result: dict) -> float:
    """Prompt-weighted mIoU over a question set's layout and reading questions."""
    pairs = [(result[f"miou_{k}"], result.get(f"count_{k}", 1)) for k in ("layout", "reading") if f"miou_{k}" in result]
    total = sum(n for _, n in pairs)
    return sum(v * n for v, n in pairs) / total if total else float("nan")


def summarise(results: dict) -> dict:
    """The numbers a reader compares (mIoU ×100) from one checkpoint's `evaluate` result."""
    q = results["question"]
    out = {"layout_reading": layout_reading(q), "layout": q.get("miou_layout"), "reading": q.get("miou_reading")}
    if "question_no_ocr" in results:
        out["layout_reading_no_ocr"] = layout_reading(results["question_no_ocr"])
    for name in ("box_region", "point_region"):
        if name in results:
            out[name] = results[name]["miou"]
            out |= {f"{name}_{size}": results[name][f"miou_{size}"] for size in ("small", "medium", "large")
                    if f"miou_{size}" in results[name]}
    out["prompts"] = {k[len("count_"):]: int(v) for k, v in q.items() if k.startswith("count_")}
    return {k: (round(100 * v, 2) if isinstance(v, float) else v) for k, v in out.items()}


def mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return round(sum(values) / len(values), 2) if values else None


def compare(runs: list[dict]) -> dict:
    """Per arm the mean over seeds; the pretrained-minus-random and ablation differences."""
    arms: dict[str, dict] = {}
    for run in runs:
        arms.setdefault(run["arm"], {"seeds": [], "runs": []})
        arms[run["arm"]]["seeds"].append(run["seed"])
        arms[run["arm"]]["runs"].append(run["summary"])
    for arm in arms.values():
        arm["mean"] = {k: mean([r.get(k) for r in arm["runs"]]) for k in SUMMARY_KEYS}
        del arm["runs"]
    diffs = {}

    def diff(a: str, b: str) -> float | None:
        if a in arms and b in arms and arms[a]["mean"]["layout_reading"] is not None:
            return round(arms[a]["mean"]["layout_reading"] - arms[b]["mean"]["layout_reading"], 2)
        return None

    regimes = sorted({parse_arm(name)[1] for name in arms}, key=lambda r: (r != "full", r))
    for regime in regimes:
        suffix = regime_suffix(regime)
        value = diff(arm_name("pretrained", regime), arm_name("random", regime))
        if value is not None:
            diffs[f"pretrained_minus_random{suffix}"] = value
            if regime == "full":
                diffs["pretrained_minus_random_labels_all"] = value
        for ablation in INITS[2:]:
            value = diff(arm_name(ablation, regime), arm_name("pretrained", regime))
            if value is not None:
                diffs[f"{ablation}_minus_pretrained{suffix}"] = value
    return {"arms": arms, **diffs}


def table(runs: list[dict], comparison: dict) -> str:
    head = "| arm | seeds | layout+reading | layout | reading | L+R, words removed | box -> region | click -> region |"
    lines = [head, "|" + "---|" * 8]
    by_arm: dict[str, list[dict]] = {}
    for run in runs:
        by_arm.setdefault(run["arm"], []).append(run)
    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    for arm, arm_runs in by_arm.items():
        cells = []
        for key in SUMMARY_KEYS:
            per_seed = " / ".join(fmt(r["summary"].get(key)) for r in arm_runs)
            cells.append(f"{per_seed} (**{fmt(comparison['arms'][arm]['mean'][key])}**)" if len(arm_runs) > 1 else per_seed)
        lines.append(f"| {arm} | {', '.join(str(r['seed']) for r in arm_runs)} | " + " | ".join(cells) + " |")
    diffs = [f"{k} = {v:+.1f}" for k, v in comparison.items() if k != "arms"]
    return "\n".join(lines) + ("\n\n" + ", ".join(diffs) if diffs else "")


class Runner:
    def __init__(self, args) -> None:
        self.args = args
        self.corpus = args.corpus.resolve()
        self.data = ["data=corpus_mixed", f"data.train_set.datasets.0.root={self.corpus}",
                     f"data.val_set.root={self.corpus}"]

    def done(self, ckpt: Path, steps: int) -> bool:
        from dociq.io.checkpoint import read_checkpoint

        return ckpt.is_file() and int(read_checkpoint(ckpt).get("global_step", 0)) >= steps

    def command(self, out: Path, overrides: list[str]) -> list[str]:
        """The overrides of a run into `out`, resuming its last.ckpt when one is there."""
        ckpt = out / "checkpoints" / "last.ckpt"
        resume = [f"ckpt_path={ckpt}"] if ckpt.is_file() else []
        if resume:
            print(f"[eval_pretraining] resuming {ckpt}", flush=True)
        return [*overrides, f"paths.output_dir={out}", *resume]

    def train_or_reuse(self, out: Path, overrides: list[str], steps: int) -> Path:
        """`out`'s last.ckpt after `steps` steps: reused, resumed or trained (in this process)."""
        ckpt = out / "checkpoints" / "last.ckpt"
        if self.done(ckpt, steps):
            print(f"[eval_pretraining] reusing {ckpt}", flush=True)
            return ckpt
        overrides = self.command(out, overrides)
        print(f"[eval_pretraining] python train.py {' '.join(overrides)}", flush=True)
        run_stage(overrides)
        if not ckpt.is_file():
            raise RuntimeError(f"the run into {out} wrote no {ckpt.name}; see its train.log")
        return ckpt

    def pretrain_ckpt(self, init: str, seed: int) -> Path:
        if init == "pretrained" and self.args.pretrain_ckpt:
            path = Path(self.args.pretrain_ckpt.format(seed=seed))
            if not path.is_file():
                raise FileNotFoundError(f"--pretrain-ckpt {path} (seed {seed}) does not exist")
            return path
        steps = self.args.pretrain_steps
        losses = [] if init == "pretrained" else [f"task.loss.{init[len('no_'):]}=0"]
        overrides = ["stage=pretrain", *self.data, f"trainer.max_steps={steps}", f"seed={seed}", *losses,
                     *self.args.override, *self.args.pretrain_override]
        name = "pretrain" if init == "pretrained" else f"pretrain-{init}"
        return self.train_or_reuse(self.args.workdir / f"{name}_s{seed}", overrides, steps)

    def finetune_job(self, init: str, regime: str, seed: int) -> dict:
        """Where a fine-tuning run goes, its overrides and steps, the pretraining it starts from."""
        step_share, labels = regime_spec(regime)
        steps = max(1, round(self.args.steps * step_share))
        pretrain = None if init == "random" else self.pretrain_ckpt(init, seed)
        overrides = ["stage=finetune", *self.data, f"trainer.max_steps={steps}",
                     f"trainer.val_check_interval={min(steps, self.args.val_every)}",
                     f"init.from={pretrain}" if pretrain else "init.from=null", f"seed={seed}"]
        if labels is not None:
            from dociq.data.datasets.corpus.dataset import CorpusDocuments
            pages = labels if isinstance(labels, int) else \
                max(1, round(len(CorpusDocuments(self.corpus, split="train")) * labels))
            overrides.append(f"data.train_set.datasets.0.max_pages={pages}")
        if regime == "genre":
            overrides.append(f"data.train_set.datasets.0.packages=[{','.join(self.labelled_packages())}]")
        overrides += [*self.args.override, *self.args.finetune_override]
        given = self.args.reuse.get(f"{arm_name(init, regime)}:{seed}")
        if given is not None:   # a run made elsewhere: resumed in its folder when it is short of steps
            out, recorded = given, hydra_overrides(given) or overrides
        else:
            out, recorded = self.args.workdir / f"{init}{'' if regime == 'full' else '-' + regime}_s{seed}", overrides
        return {"out": out, "overrides": overrides, "recorded": recorded, "steps": steps, "pretrain": pretrain}

    def labelled_packages(self) -> list[str]:
        """The training split's packages less --genre-package: what the genre regime labels."""
        from dociq.data.datasets.corpus.dataset import CorpusDocuments

        package = self.args.genre_package
        if not package:
            raise ValueError("the genre regime needs --genre-package P: the package whose pages it never labels")
        train = CorpusDocuments(self.corpus, split="train")
        packages = sorted({train.page_meta(i)["package"] for i in range(len(train))})
        if package not in packages:
            raise ValueError(f"--genre-package {package!r} has no training pages in {self.corpus} (it has {packages})")
        return [p for p in packages if p != package]

    def train_all(self, jobs: list[dict]) -> None:
        """Train every job whose last.ckpt is short of its steps: here, or --jobs at a time as
        `python train.py` processes sharing the cores."""
        todo = [job for job in jobs if not self.done(job["out"] / "checkpoints" / "last.ckpt", job["steps"])]
        if self.args.jobs <= 1:
            for job in todo:
                self.train_or_reuse(job["out"], job["overrides"], job["steps"])
            return
        env = {**os.environ, "OMP_NUM_THREADS": str(threads_per_job(self.args.jobs))}
        running: list[tuple[dict, subprocess.Popen]] = []
        failed = []
        for job in [*todo, None]:
            while running and (job is None or len(running) >= self.args.jobs):
                for item in list(running):
                    if item[1].poll() is not None:
                        running.remove(item)
                        if item[1].returncode != 0:
                            failed.append(item[0]["out"])
                time.sleep(0.5)
            if job is None:
                break
            job["out"].mkdir(parents=True, exist_ok=True)
            overrides = self.command(job["out"], job["overrides"])
            print(f"[eval_pretraining] python train.py {' '.join(overrides)}", flush=True)
            with open(job["out"] / "train_stdout.log", "ab") as log:
                running.append((job, subprocess.Popen([sys.executable, str(TRAIN_PY), *overrides], env=env,
                                                      stdout=log, stderr=subprocess.STDOUT)))
        if failed:
            raise RuntimeError(f"fine-tuning failed in {[str(f) for f in failed]}: see train_stdout.log there")

    def eval_packages(self, regime: str) -> list[str] | None:
        return [self.args.genre_package] if regime == "genre" else None

    def cached(self, ckpt: Path, packages: list[str] | None) -> tuple[Path, dict, dict | None]:
        """(cache file, its key, the cached results or None)."""
        from dociq.io.checkpoint import read_checkpoint

        cache = ckpt.parent.parent / ("eval_real.json" if packages is None else f"eval_real_{'_'.join(packages)}.json")
        step = int(read_checkpoint(ckpt).get("global_step", 0))
        key = {"checkpoint": str(ckpt.resolve()), "global_step": step, "corpus": str(self.corpus),
               "split": "val", "pages": self.args.eval_pages, "prompt_sets": list(PROMPT_SETS),
               "path": "predictor"}
        if packages is not None:
            key["packages"] = packages
        if cache.is_file():
            cached = json.loads(cache.read_text())
            if cached.get("key") == key:
                return cache, key, cached["results"]
        return cache, key, None

    def evaluate_all(self, items: list[tuple[Path, list[str] | None]]) -> list[dict]:
        """`dociq eval`'s prompt sets on the held-out split of each (checkpoint, packages), cached
        beside the checkpoint; --jobs at a time."""
        found = [self.cached(ckpt, packages) for ckpt, packages in items]
        todo = [i for i, (_, _, results) in enumerate(found) if results is None]
        out = [results for _, _, results in found]

        def keep(i: int, results: dict) -> None:   # cached as it comes: a killed run keeps what it scored
            cache, key, _ = found[i]
            cache.write_text(json.dumps({"key": key, "results": results}, indent=1))
            out[i] = results

        calls = {i: (str(items[i][0]), str(self.corpus), self.args.eval_pages, items[i][1]) for i in todo}
        if self.args.jobs <= 1:
            for i, call in calls.items():
                keep(i, evaluate_checkpoint(*call))
            return out
        with ProcessPoolExecutor(self.args.jobs, mp_context=get_context("spawn"),
                                 initializer=_limit_threads, initargs=(threads_per_job(self.args.jobs),)) as pool:
            futures = {pool.submit(evaluate_checkpoint, *call): i for i, call in calls.items()}
            for future in as_completed(futures):
                keep(futures[future], future.result())
        return out


TRAIN_PY = Path(__file__).resolve().parents[1] / "train.py"


def threads_per_job(jobs: int) -> int:
    return max(1, (os.cpu_count() or 1) // max(1, jobs))


def _limit_threads(threads: int) -> None:
    import torch
    torch.set_num_threads(threads)


def evaluate_checkpoint(ckpt: str, corpus: str, pages: int | None, packages: list[str] | None) -> dict:
    """One checkpoint's held-out results (a top-level function: it runs in worker processes too)."""
    from dociq.data.datasets.corpus.dataset import CorpusDocuments
    from dociq.evaluation.answers import evaluate_answers
    from dociq.inference.predictor import Predictor

    import torch

    t0 = time.time()
    predictor = Predictor.from_checkpoint(ckpt, device="cuda" if torch.cuda.is_available() else "cpu")
    results = evaluate_answers(predictor, CorpusDocuments(corpus, split="val", packages=packages), pages,
                               prompt_sets=PROMPT_SETS)
    print(f"[eval_pretraining] evaluated {ckpt}{'' if packages is None else f' on {packages}'} "
          f"in {time.time() - t0:.0f} s", flush=True)
    return results


def hydra_overrides(run_dir: Path) -> list[str] | None:
    """The overrides `python train.py` recorded for a run made elsewhere."""
    path = run_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return None
    import yaml
    return yaml.safe_load(path.read_text())


def pretraining_curves(ckpt: Path) -> dict:
    """Held-out `val/mlm_acc` and `val/unexplained` by step, from the pretraining run's metrics.csv."""
    path = ckpt.parent.parent / "csv" / "metrics.csv"
    if not path.is_file():
        return {}
    curves: dict[str, list] = {"val/mlm_acc": [], "val/unexplained": [], "val/loss": []}
    with path.open() as f:
        for row in csv.DictReader(f):
            for name, points in curves.items():
                if row.get(name):
                    points.append([int(row["step"]), round(float(row[name]), 4)])
    return curves


def probe(ckpts: dict[tuple[str, int], Path], corpus: Path, train_pages: int, test_pages: int) -> list[dict]:
    """The unit-class probe on real pages of a random image encoder per seed and of each pretraining
    checkpoint's online (what fine-tuning starts from) and EMA target encoders."""
    from dociq.data.datasets.corpus.dataset import CorpusDocuments
    from dociq.training.probe import probe_encoder
    from dociq.io.checkpoint import read_checkpoint

    train = [p for p in CorpusDocuments(corpus, split="train", max_pages=train_pages)]
    test = [p for p in CorpusDocuments(corpus, split="val", max_pages=test_pages)]
    model = read_checkpoint(next(iter(ckpts.values())))["hyper_parameters"]["model"]
    size, image_size, unit = model["size"], int(model["image_size"]), int(model["mask_unit_px"])
    specs = [("random", seed, f"random:{seed}") for seed in sorted({s for _, s in ckpts})]
    specs += [(init, seed, spec) for (init, seed), ckpt in ckpts.items() for spec in (str(ckpt), f"{ckpt}:target")]
    rows = []
    for init, seed, spec in specs:
        r = probe_encoder(load_encoder(spec, size, image_size), train, test, image_size, unit)
        rows.append({"init": init, "seed": seed, "encoder": spec, **vars(r)})
        print(f"[eval_pretraining] probe {spec}: balanced accuracy {r.balanced_accuracy:.3f}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, required=True, help="where to write the results")
    p.add_argument("--arms", nargs="+", default=["pretrained", "random", "pretrained/quarter", "random/quarter"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    p.add_argument("--steps", type=int, default=1200, help="the full fine-tuning budget (make finetune's)")
    p.add_argument("--val-every", type=int, default=300, help="trainer.val_check_interval of the fine-tuning runs")
    p.add_argument("--pretrain-ckpt", help="the pretrained checkpoint, '{seed}' replaced by the seed; "
                   "default: pretrain into --workdir")
    p.add_argument("--pretrain-steps", type=int, default=300, help="stage=pretrain steps (its default budget)")
    p.add_argument("--corpus", type=Path, default=Path("data/corpus"), help="a `dociq corpus build` folder")
    p.add_argument("--eval-pages", type=int, default=None, help="held-out pages to evaluate (default: all)")
    p.add_argument("--workdir", type=Path, default=Path("outputs/eval_pretraining"))
    p.add_argument("--run", action="append", default=[], metavar="ARM:SEED=DIR",
                   help="reuse a finished fine-tuning run, e.g. --run pretrained:0=outputs/finetune/runs/x")
    p.add_argument("--probe", action="store_true", help="also the unit-class probe on real pages")
    p.add_argument("--probe-pages", nargs=2, type=int, default=[192, 64], metavar=("TRAIN", "TEST"))
    p.add_argument("--genre-package", help="the package the genre regime never labels and is scored on")
    p.add_argument("--jobs", type=int, default=1, help="fine-tuning runs (and evaluations) at a time")
    p.add_argument("--override", action="append", default=[], help="Hydra override for every run")
    p.add_argument("--pretrain-override", action="append", default=[])
    p.add_argument("--finetune-override", action="append", default=[])
    args = p.parse_args(argv)
    arms = [parse_arm(a) for a in args.arms]
    if args.jobs < 1:
        raise ValueError(f"--jobs {args.jobs}: give at least 1")
    args.workdir = args.workdir.resolve()
    args.reuse = {}
    for spec in args.run:
        key, _, folder = spec.partition("=")
        if not (Path(folder) / "checkpoints" / "last.ckpt").is_file():
            raise FileNotFoundError(f"--run {spec}: {folder}/checkpoints/last.ckpt does not exist")
        arm, _, seed = key.rpartition(":")
        args.reuse[f"{arm_name(*parse_arm(arm))}:{int(seed)}"] = Path(folder).resolve()
    if not (args.corpus / "corpus.json").is_file():
        raise FileNotFoundError(f"--corpus {args.corpus} has no corpus.json: build it first (make corpus)")

    runner = Runner(args)
    runs: list[dict] = []
    pretrained: dict[tuple[str, int], Path] = {}   # (init, seed) -> pretraining checkpoint

    def save(probe_rows: list[dict] | None = None) -> dict:
        comparison = compare(runs)
        out = {"runs": runs, **comparison, **({"probe": probe_rows} if probe_rows is not None else {})}
        out["pretraining"] = [{"init": init, "seed": seed, "checkpoint": str(c), "curves": pretraining_curves(c)}
                              for (init, seed), c in pretrained.items()]
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "reuse"}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**out, "settings": settings}, indent=1))
        print(table(runs, comparison), flush=True)
        return out

    planned = [(init, regime, seed, runner.finetune_job(init, regime, seed)) for init, regime in arms for seed in args.seeds]
    # one run at a time: trained, evaluated and saved in turn, so a crash keeps what was measured;
    # --jobs N: every run trained N at a time, then every checkpoint evaluated N at a time
    batches = [planned] if args.jobs > 1 else [[item] for item in planned]
    for batch in batches:
        runner.train_all([job for *_, job in batch])
        items = [(job["out"] / "checkpoints" / "last.ckpt", runner.eval_packages(regime)) for _, regime, _, job in batch]
        for (init, regime, seed, job), (ckpt, packages), results in zip(batch, items, runner.evaluate_all(items)):
            if job["pretrain"]:
                pretrained[(init, seed)] = job["pretrain"]
            runs.append({"arm": arm_name(init, regime), "seed": seed, "checkpoint": str(ckpt),
                         "pretrain_checkpoint": str(job["pretrain"]) if job["pretrain"] else None,
                         "overrides": job["recorded"], "eval_packages": packages,
                         "summary": summarise(results), "results": results})
        save()
    return save(probe(pretrained, args.corpus, *args.probe_pages) if args.probe and pretrained else None)


if __name__ == "__main__":
    main()
