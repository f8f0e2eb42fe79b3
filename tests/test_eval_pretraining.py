"""scripts/eval_pretraining.py: pretrained against random init on held-out real pages, the differences a
reader is told, and runs that are reused or resumed instead of trained again."""
import json
import sys
from pathlib import Path

import pytest

from script_module import load_script

REPO = Path(__file__).resolve().parents[1]
_PATHS = [str(REPO / "tests" / "data" / "corpus"), str(REPO / "scripts")]
sys.path[:0] = _PATHS
import eval_pretraining  # noqa: E402
from corpus_testdata import build  # noqa: E402

for _path in _PATHS:
    sys.path.remove(_path)


def _result(layout: float, reading: float, n_layout: int = 3, n_reading: int = 1) -> dict:
    return {"question": {"miou": 0.0, "miou_layout": layout, "count_layout": n_layout,
                         "miou_reading": reading, "count_reading": n_reading},
            "box_region": {"miou": 0.5, "miou_small": 0.25}}


def test_layout_and_reading_are_weighted_by_their_prompts():
    summary = eval_pretraining.summarise(_result(0.2, 0.6))
    assert summary["layout_reading"] == pytest.approx(30.0)       # (3 * 20 + 1 * 60) / 4
    assert summary["layout"] == 20.0 and summary["reading"] == 60.0
    assert summary["box_region"] == 50.0 and summary["box_region_small"] == 25.0
    assert summary["prompts"] == {"layout": 3, "reading": 1}


def test_differences_are_means_over_seeds_in_points():
    def run(arm, seed, layout):
        return {"arm": arm, "seed": seed, "summary": eval_pretraining.summarise(_result(layout, layout))}
    runs = [run("pretrained", 0, 0.40), run("pretrained", 1, 0.30), run("random", 0, 0.20), run("random", 1, 0.30),
            run("pretrained/quarter", 0, 0.30), run("random/quarter", 0, 0.10), run("no_mlm", 0, 0.33),
            run("no_mlm", 1, 0.33)]
    out = eval_pretraining.compare(runs)
    assert out["arms"]["pretrained"]["mean"]["layout_reading"] == 35.0
    assert out["pretrained_minus_random"] == 10.0
    assert out["pretrained_minus_random_quarter"] == 20.0
    assert out["no_mlm_minus_pretrained"] == -2.0
    assert "pretrained_minus_random_quarter_labels" not in out     # that arm did not run
    with pytest.raises(ValueError, match="no_pixels"):
        eval_pretraining.parse_arm("no_pixels/quarter")


SMALL = ["model.image_size=128", "data.batch_size=2", "data.num_workers=0", "data.tokenizer.max_length=48",
         "data.train_set.datasets.1.num_pages=8", "trainer.limit_val_batches=1", "optim.scheduler.warmup_steps=1",
         "trainer.enable_progress_bar=false", "data.max_questions=2"]
PRETRAIN_SMALL = ["trainer.val_check_interval=1", "data.image_masking.num_targets=2", "data.image_masking.target_scale=[0.25,0.3]",
                  "data.image_masking.min_keep=1"]


def test_pretrained_and_random_arms_run_evaluate_and_are_reused(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    build(corpus)
    args = ["--corpus", str(corpus), "--workdir", str(tmp_path / "work"), "--seeds", "0",
            "--arms", "pretrained", "random", "pretrained/quarter-labels", "--steps", "4", "--val-every", "2",
            "--pretrain-steps", "2", "--probe", "--probe-pages", "4", "2",
            *[f"--override={o}" for o in SMALL], *[f"--pretrain-override={o}" for o in PRETRAIN_SMALL]]
    out_json = tmp_path / "r.json"
    eval_pretraining.main(["--json", str(out_json), *args])
    data = json.loads(out_json.read_text())
    arms = [r["arm"] for r in data["runs"]]
    assert arms == ["pretrained", "random", "pretrained/quarter-labels"]
    pretrained, random, labels = data["runs"]
    assert any(o.startswith("init.from=") and o.endswith("last.ckpt") for o in pretrained["overrides"])
    assert "init.from=null" in random["overrides"] and random["pretrain_checkpoint"] is None
    # 6 training pages in the test corpus: a quarter keeps 2 of them
    assert "data.train_set.datasets.0.max_pages=2" in labels["overrides"]
    # the held-out split: one document, two pages, a layout and a category question each
    assert pretrained["summary"]["prompts"]["layout"] == 2
    assert 0.0 <= pretrained["summary"]["layout_reading"] <= 100.0
    assert data["pretrained_minus_random"] == pytest.approx(
        pretrained["summary"]["layout_reading"] - random["summary"]["layout_reading"], abs=0.011)
    assert data["pretraining"][0]["curves"]["val/mlm_acc"], "the pretraining run's held-out MLM curve"
    assert {r["encoder"].split(":")[-1] for r in data["probe"]} >= {"0", "target"}
    assert all(0.0 <= r["balanced_accuracy"] <= 1.0 for r in data["probe"])

    # A second call trains nothing: every checkpoint has its steps and its evaluation is cached.
    def no_training(overrides):
        raise AssertionError(f"trained again: {overrides}")
    monkeypatch.setattr(eval_pretraining, "run_stage", no_training)
    again = eval_pretraining.main(["--json", str(tmp_path / "again.json"), *[a for a in args if a != "--probe"]])
    assert again["pretrained_minus_random"] == data["pretrained_minus_random"]


def test_regimes_name_their_differences_and_reject_typos():
    assert eval_pretraining.regime_spec("labels-50") == (1.0, 50)
    assert eval_pretraining.regime_suffix("labels-50") == "_labels_50"
    assert eval_pretraining.regime_suffix("genre") == "_unseen_genre"
    for bad in ("labels-0", "labels-x", "labels"):
        with pytest.raises(ValueError, match="labels-N"):
            eval_pretraining.parse_arm(f"random/{bad}")

    def run(arm, layout):
        return {"arm": arm, "seed": 0, "summary": eval_pretraining.summarise(_result(layout, layout))}
    out = eval_pretraining.compare([run("pretrained/labels-50", 0.5), run("random/labels-50", 0.2),
                                    run("pretrained/genre", 0.3), run("random/genre", 0.35),
                                    run("pretrained", 0.4), run("random", 0.39)])
    assert out["pretrained_minus_random_labels_50"] == 30.0
    assert out["pretrained_minus_random_unseen_genre"] == -5.0
    assert out["pretrained_minus_random_labels_all"] == out["pretrained_minus_random"] == 1.0


def test_label_budget_and_unseen_genre_arms_train_side_by_side(tmp_path):
    """--jobs 2: the runs train as two `python train.py` processes and are evaluated two at a time;
    labels-N keeps N labelled pages, the genre regime labels no page of --genre-package and is
    scored on that package's held-out pages only."""
    corpus = tmp_path / "corpus"
    build(corpus)
    out_json = tmp_path / "r.json"
    eval_pretraining.main(["--json", str(out_json), "--corpus", str(corpus), "--workdir", str(tmp_path / "work"),
                           "--seeds", "0", "--arms", "random/labels-2", "random/genre", "--genre-package", "beta",
                           "--jobs", "2", "--steps", "2", "--val-every", "2", *[f"--override={o}" for o in SMALL]])
    data = json.loads(out_json.read_text())
    labels, genre = data["runs"]
    assert "data.train_set.datasets.0.max_pages=2" in labels["overrides"]
    assert "data.train_set.datasets.0.packages=[alpha]" in genre["overrides"]
    assert labels["eval_packages"] is None and genre["eval_packages"] == ["beta"]
    for run in data["runs"]:
        assert Path(run["checkpoint"]).is_file()
        assert (Path(run["checkpoint"]).parents[1] / "train_stdout.log").is_file()
    # the held-out split is beta's two pages: all of it for labels-2, beta's for the genre run
    assert labels["summary"]["prompts"]["layout"] == genre["summary"]["prompts"]["layout"] == 2
    with pytest.raises(ValueError, match="gamma"):
        eval_pretraining.main(["--json", str(out_json), "--corpus", str(corpus), "--workdir", str(tmp_path / "w2"),
                               "--seeds", "0", "--arms", "random/genre", "--genre-package", "gamma",
                               "--steps", "2", *[f"--override={o}" for o in SMALL]])


@pytest.mark.slow
def test_the_gpu_study_script_runs_end_to_end_on_the_cpu(tmp_path):
    """scripts/pretraining_study_gpu.sh with TRAINER=cpu and tiny pages: smoke, step times turned
    into step counts, pretraining, 16 fine-tuning runs two at a time, the JSON with every key."""
    import os
    import subprocess

    corpus = tmp_path / "corpus"
    build(corpus)
    env = {**os.environ, "CORPUS": str(corpus), "WORK": str(tmp_path / "work"), "TRAINER": "cpu", "JOBS": "2",
           "SMOKE_STEPS": "12", "PRETRAIN_SECONDS": "1", "FINETUNE_SECONDS": "1", "PRETRAIN_BATCH": "2",
           "PRETRAIN_WORKERS": "0", "FINETUNE_SIZE": "128", "GENRE": "beta", "PY": sys.executable,
           "EXTRA": "data.tokenizer.max_length=48 data.max_questions=2 data.train_set.datasets.1.num_pages=8"}
    out = subprocess.run(["bash", str(REPO / "scripts" / "pretraining_study_gpu.sh")], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    data = json.loads((tmp_path / "work" / "study.json").read_text())
    assert len(data["runs"]) == 16
    for key in ("labels_50", "labels_200", "labels_all", "unseen_genre"):
        assert f"pretrained_minus_random_{key}" in data
    timings = (tmp_path / "work" / "timings.txt").read_text()
    assert "pretraining: 20 steps" in timings and "16 runs of 20 steps" in timings


@pytest.mark.slow
def test_the_gpu_study_script_can_stop_after_the_pretraining(tmp_path):
    """FINETUNE_SECONDS=0: the smoke and the pretraining alone (the arms are trained elsewhere), as long
    as PRETRAIN_STEPS says, its validations where PRETRAIN_VALIDATIONS puts them, the checkpoint there
    and no study JSON."""
    import csv
    import os
    import subprocess

    corpus = tmp_path / "corpus"
    build(corpus)
    work = tmp_path / "work"
    env = {**os.environ, "CORPUS": str(corpus), "WORK": str(work), "TRAINER": "cpu", "SMOKE_STEPS": "12",
           "PRETRAIN_STEPS": "45", "FINETUNE_SECONDS": "0", "PRETRAIN_VALIDATIONS": "3", "PRETRAIN_BATCH": "2",
           "PRETRAIN_WORKERS": "0", "PY": sys.executable,
           "EXTRA": "data.tokenizer.max_length=48 data.train_set.datasets.1.num_pages=8"}
    out = subprocess.run(["bash", str(REPO / "scripts" / "pretraining_study_gpu.sh")], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    timings = (work / "timings.txt").read_text()
    assert "pretraining: 45 steps" in timings and "done (pretraining only)" in timings
    assert "runs of" not in timings and not (work / "study.json").exists()
    assert (work / "pretrain" / "checkpoints" / "last.ckpt").is_file()
    probed = [int(r["step"]) for r in csv.DictReader(open(work / "pretrain" / "csv" / "metrics.csv"))
              if r.get("val/probe_bacc")]
    assert sorted(set(probed)) == [0, 14, 29, 44]


@pytest.mark.slow
def test_the_objectives_study_runs_each_objective_and_reports_its_probe_curve(tmp_path):
    """scripts/objectives_study_gpu.sh with TRAINER=cpu and tiny pages: I-JEPA, MIM alone and D-JEPA side
    by side, each probed at its start, half-way and at its end, in one JSON; an arm's variants
    (`-rope`, `-small`) reach its run's config."""
    import os
    import subprocess

    corpus = tmp_path / "corpus"
    build(corpus)
    work = tmp_path / "work"
    env = {**os.environ, "CORPUS": str(corpus), "WORK": str(work), "TRAINER": "cpu", "STEPS": "8", "BATCH": "2",
           "WORKERS": "0", "SEEDS": "0", "PY": sys.executable, "RUN_SECONDS": "600",
           "ARMS": "ijepa-rope mim djepa-rope-small",
           "EXTRA": "model.image_size=128 data.tokenizer.max_length=48 data.train_set.datasets.1.num_pages=8 "
                    "trainer.limit_val_batches=1 callbacks.unit_probe.train_pages=4 callbacks.unit_probe.test_pages=2 "
                    + " ".join(PRETRAIN_SMALL[1:])}
    out = subprocess.run(["bash", str(REPO / "scripts" / "objectives_study_gpu.sh")], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    runs = json.loads((work / "objectives.json").read_text())
    assert sorted(runs) == ["djepa-rope-small_s0", "ijepa-rope_s0", "mim_s0"]
    for name, run in runs.items():
        assert [step for step, _ in run["probe"]] == [0, 3, 7], name
        assert all(0.0 <= value <= 1.0 for _, value in run["probe"])
    assert runs["djepa-rope-small_s0"]["unexplained"] is not None and runs["djepa-rope-small_s0"]["mlm_acc"] is not None
    assert runs["mim_s0"]["unexplained"] is None and runs["ijepa-rope_s0"]["probe_target"]   # no D-JEPA; an EMA target
    assert "| ijepa-rope_s0 |" in out.stdout

    def overrides(run):
        return (work / run / ".hydra" / "overrides.yaml").read_text()
    assert "model.predictor.positions=rope" in overrides("ijepa-rope_s0")
    assert "stage=ijepa" in overrides("ijepa-rope_s0") and "target_scale=[0.015,0.035]" not in overrides("ijepa-rope_s0")
    assert "model.predictor.positions=rope" in overrides("djepa-rope-small_s0")
    assert "data.image_masking.target_scale=[0.015,0.035]" in overrides("djepa-rope-small_s0")
    assert "positions=rope" not in overrides("mim_s0")


def test_objective_curves_keep_the_last_run_of_a_folder_written_twice(tmp_path):
    """scripts/plot_objectives.py: one curve per run; where a second run appended to a run's
    metrics.csv (a machine left warm), only the rows after its own step-0 probe count."""
    import csv
    module = load_script("plot_objectives")
    fields = ["step", "val/probe_bacc", "train/unexplained", "val/unexplained"]
    runs = {"ijepa_s0": [(0, 0.30, "", ""), (9, "", 3.0, ""), (99, 0.20, 1.2, 1.4),      # an earlier run
                         (0, 0.25, "", ""), (49, "", 1.5, ""), (99, 0.27, 1.1, 1.3)],
            "mim_s0": [(0, 0.25, "", ""), (99, 0.22, "", "")]}
    for run, rows in runs.items():
        folder = tmp_path / "work" / run / "csv"
        folder.mkdir(parents=True)
        with open(folder / "metrics.csv", "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(fields)
            writer.writerows(rows)
    out = module.main([str(tmp_path / "work"), "--out", str(tmp_path / "curves.png"), "--json", str(tmp_path / "c.json")])
    assert out["ijepa_s0"]["val/probe_bacc"] == [[0, 0.25], [99, 0.27]]
    assert out["ijepa_s0"]["train/unexplained"] == [[49, 1.5], [99, 1.1]]
    assert out["mim_s0"] == {"val/probe_bacc": [[0, 0.25], [99, 0.22]]}
    assert json.loads((tmp_path / "c.json").read_text()) == out
    assert (tmp_path / "curves.png").stat().st_size > 0
    with pytest.raises(SystemExit, match="WORK folder"):
        module.main([str(tmp_path / "empty"), "--out", str(tmp_path / "x.png")])


def test_the_predictor_oracle_trains_the_predictor_on_a_frozen_encoders_targets(tmp_path):
    """scripts/predictor_oracle.py on a small corpus: both references and the predictor's curve
    (held-out and training pages) are reported, finite, for block and single-unit masks."""
    import math

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import predictor_oracle
    finally:
        sys.path.remove(str(REPO / "scripts"))
    corpus = tmp_path / "corpus"
    build(corpus)
    for masking in ("blocks", "units"):
        out = predictor_oracle.main(["--corpus", str(corpus), "--train-pages", "8", "--test-pages", "4", "--steps", "5",
                                     "--batch-size", "4", "--masking", masking, "--target-norm", "page",
                                     "--json", str(tmp_path / f"{masking}.json")])
        assert out["masking"] == masking and len(out["predictor_unexplained_val_train"]) == 5
        values = [out["unit_mean_unexplained"], out["neighbour_unexplained"], out["context_neighbour_unexplained"],
                  *(v for _, *vs in out["predictor_unexplained_val_train"] for v in vs)]
        assert all(math.isfinite(v) and v >= 0 for v in values), values
        assert json.loads((tmp_path / f"{masking}.json").read_text())["masking"] == masking
