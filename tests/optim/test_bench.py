"""scripts/bench_optim.py end to end on a toy model: the sweep picks a best lr per optimizer,
the JSON rows carry the documented keys, the plots are written."""
import json
import math

from script_module import load_script


def test_bench_rows_keys_sweep_and_plots(tmp_path):
    out = tmp_path / "bench.json"
    load_script("bench_optim").main(["--steps", "4", "--d-model", "32", "--depth", "1", "--heads", "2", "--rank", "4",
                   "--seq-len", "16", "--batch-size", "2", "--eval-batches", "1", "--threads", "1",
                   "--refresh-every", "2", "--lrs", "1e-3,1e-2", "--seeds", "0,1",
                   "--optimizers", "adamw,sngd_random,sngd_random_nongd", "--json", str(out),
                   "--plots", str(tmp_path)])
    results = json.loads(out.read_text())["results"]
    assert list(results) == ["adamw", "sngd_random", "sngd_random_nongd"]
    for name, row in results.items():
        for key in ("state_bytes_per_param", "state_bytes_per_projected_param", "step_ms_median",
                    "step_ms_max", "final_loss", "peak_bytes_per_param", "best_lr", "seeds"):
            assert key in row, (name, key)
        assert row["seeds"] == [0, 1] and row["best_lr"] in (1e-3, 1e-2)
        assert set(row["sweep"]) == {"0.001", "0.01"}
        assert math.isclose(row["sweep"][f"{row['best_lr']:g}"], min(row["sweep"].values()))
        assert math.isfinite(row["final_loss"]) and len(row["final_loss_per_seed"]) == 2
    assert results["adamw"]["fused"] is True
    assert results["adamw"]["state_bytes_per_param"] > 7.9            # exp_avg + exp_avg_sq
    assert results["sngd_random"]["state_bytes_per_projected_param"] < 8
    assert (tmp_path / "optim_loss_vs_steps.png").stat().st_size > 0
    assert (tmp_path / "optim_loss_vs_time.png").stat().st_size > 0


def test_memory_bench_counts_adamws_two_moments_and_sngds_smaller_state(tmp_path):
    out = tmp_path / "memory.json"
    rows = load_script("bench_optim_memory").main(["--model", "dociq-tiny", "--world", "1", "--threads", "1", "--steps", "3",
                                               "--optimizers", "adamw,sngd_coordinates", "--json", str(out)])
    by_name = {r["optimizer"]: r for r in rows}
    assert json.loads(out.read_text()) == rows
    adamw, sngd = by_name["adamw"], by_name["sngd_coordinates"]
    assert "error" not in adamw and "error" not in sngd
    assert adamw["device"] == "cpu" and adamw["params"] == sngd["params"]
    # exp_avg + exp_avg_sq in fp32, and a step count per tensor
    assert 8 * adamw["params"] < adamw["state"] < 8.001 * adamw["params"]
    assert 0 < sngd["state"] < adamw["state"]
    assert adamw["step_s"] > 0 and sngd["step_s"] > 0      # the median of the steps after the first


def test_memory_bench_on_a_gpu_measures_one_process():
    import pytest

    with pytest.raises(SystemExit):
        load_script("bench_optim_memory").main(["--device", "cuda", "--world", "1", "2"])
