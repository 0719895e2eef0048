"""bench/harness.py (sampler, timer, publisher), bench/docs_tables.py (the docs' tables equal their
results) and the paired decision rule of bench/studies/choose_finetune_defaults.py."""
import json
import math
import re
import statistics
import sys
import time
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import docs_tables  # noqa: E402
import harness  # noqa: E402
from conftest import load_file


def load_script(path: Path):
    return load_file(path, path.stem)


def write_tsv(directory: Path, rows_per_file: int = 6) -> Path:
    """Two WMT-style files of distinct rows."""
    directory.mkdir(parents=True, exist_ok=True)
    for k, name in enumerate(("wmt15.cs-en.tsv", "wmt16.de-en.tsv")):
        lines = ["lp\tyear\tref\thyp\tscore"] + [
            f"{name[6:11]}\t{2015 + k}\tthe cat sat on mat {k} {i}\ta dog ran in the city {k} {i}\t{(i - 2) / 5}"
            for i in range(rows_per_file)]
        (directory / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


# --- sampler ------------------------------------------------------------------------------------

def test_the_sample_is_seeded_and_draws_from_every_row(tmp_path):
    data = write_tsv(tmp_path)
    a, b = harness.wmt_sample(data, 5, seed=3), harness.wmt_sample(data, 5, seed=3)
    assert a == b and len({(r["hyp"], r["ref"]) for r in a}) == 5
    assert harness.wmt_sample(data, 5, seed=4) != a
    everything = harness.wmt_sample(data, None, seed=3)
    assert sorted(map(str, everything)) == sorted(map(str, harness.wmt_sample(data, 12, seed=0)))
    assert everything[:5] == a  # a sample is the start of the seeded order
    with pytest.raises(SystemExit, match="12 rows found, 13 requested"):
        harness.wmt_sample(data, 13)


def test_a_distinct_sample_has_no_repeated_pair(tmp_path):
    data = write_tsv(tmp_path)
    path = data / "wmt15.cs-en.tsv"
    path.write_text(path.read_text() + path.read_text().splitlines()[1] + "\n")  # a repeated pair
    assert len(harness.wmt_sample(data, 13)) == 13
    pairs = [(r["hyp"], r["ref"]) for r in harness.wmt_sample(data, 12, distinct=True)]
    assert len(set(pairs)) == 12
    with pytest.raises(SystemExit):
        harness.wmt_sample(data, 13, distinct=True)


# --- timer --------------------------------------------------------------------------------------

def test_the_timer_warms_up_then_times_each_call():
    calls = []
    timing = harness.time_call(lambda: calls.append(1), repeats=4, warmup=2)
    assert len(calls) == 6 and len(timing.runs) == len(timing.cpu) == 4
    assert timing.median == statistics.median(timing.runs) and timing.min == min(timing.runs)
    assert set(timing.figures()) == {"median_s", "min_s", "runs_s", "cpu_s"}
    synced = []
    harness.time_call(lambda: None, repeats=3, warmup=0, sync=lambda: synced.append(1))
    assert len(synced) == 6  # before the clock starts and before it stops
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        harness.time_call(lambda: None, repeats=0)


# --- publisher ----------------------------------------------------------------------------------

def test_a_published_result_carries_its_provenance_and_renders_its_report(tmp_path):
    data = write_tsv(tmp_path / "data")
    table = harness.table(["system", "s"], [["a", "1.5"], ["", "2"]], align="-r")
    path = harness.publish(tmp_path / "out", "demo", "A demo", {"x": 1.5}, {"main": table},
                           ["Some text.", {"table": "main"}], data=harness.data_provenance(data, 4, 0),
                           command="python bench/demo.py --flag")
    res = harness.load(path)
    p = res["provenance"]
    assert re.fullmatch(r"[0-9a-f]{40}", p["commit"]) and isinstance(p["dirty"], bool)
    assert p["command"] == "python bench/demo.py --flag" and p["date"].endswith("+00:00")
    assert p["versions"]["python"] and p["versions"]["torch"] and p["device"]["cores"]
    assert p["data"]["sample"] == {"n": 4, "seed": 0, "sampler": "bench/harness.py:wmt_sample"}
    assert p["data"]["files"] == ["wmt15.cs-en.tsv", "wmt16.de-en.tsv"]
    text = (tmp_path / "out" / "demo.md").read_text()
    assert text == harness.render(res)
    assert text.startswith("# A demo\n\n`python bench/demo.py --flag`\n\n- Commit: `")
    assert "Some text.\n\n| system | s |\n|---|---:|\n| a | 1.5 |\n| | 2 |\n" in text


def test_bad_tables_and_bodies_are_refused(tmp_path):
    with pytest.raises(ValueError, match="a row has 1 cells for 2 columns"):
        harness.table(["a", "b"], [["x"]])
    with pytest.raises(ValueError, match="align"):
        harness.table(["a", "b"], [["x", "y"]], align="-x")
    with pytest.raises(ValueError, match="tables that do not exist: \\['t'\\]"):
        harness.result("r", "R", {}, {}, [{"table": "t"}])
    (tmp_path / "old.json").write_text(json.dumps({"runs": []}))
    with pytest.raises(ValueError, match="not a torchmover-bench/1 result"):
        harness.load(tmp_path / "old.json")


def test_every_stored_result_has_provenance_and_its_report_is_its_rendering():
    results = sorted((ROOT / "bench" / "results").glob("*.json"))
    assert len(results) > 30
    for path in results:
        res = harness.load(path)
        assert res["name"] == path.stem and res["provenance"]["command"], path
        assert res["provenance"]["commit"] == "unknown" or re.fullmatch(r"[0-9a-f]{40}", res["provenance"]["commit"])
    assert docs_tables.stale_reports() == []


# --- the docs' tables ---------------------------------------------------------------------------

def test_every_marked_table_of_the_docs_equals_its_json():
    assert docs_tables.main(["--check"]) == 0
    marked = {(r, t) for page in ("results.md", "guide/performance.md")
              for _, _, r, t in docs_tables.marked_tables((ROOT / "docs" / page).read_text(encoding="utf-8"))}
    assert ("bench_peers", "docs_cpu") in marked and ("select_defaults", "docs_choice") in marked
    assert len(marked) >= 16


def test_a_table_that_differs_from_its_json_is_found_and_rewritten(tmp_path):
    harness.publish(tmp_path, "r", "R", {}, {"t": harness.table(["a", "b"], [["1", "2.50"]], "-r")})
    page = "Text.\n\n<!-- table: r#t -->\n| a | b |\n|---|---:|\n| 1 | 2.5 |\n\nMore.\n"
    synced, differ = docs_tables.sync_page(page, tmp_path)
    assert differ == ["r#t"]
    assert synced == page.replace("| 1 | 2.5 |", "| 1 | 2.50 |")
    assert docs_tables.sync_page(synced, tmp_path) == (synced, [])
    with pytest.raises(SystemExit, match="has no table 'u'"):
        docs_tables.sync_page("<!-- table: r#u -->\n", tmp_path)
    (tmp_path / "r.md").write_text("# edited by hand\n")
    assert docs_tables.stale_reports(tmp_path) == [tmp_path / "r.md"]


def test_the_gpu_tables_of_the_docs_are_computed_from_the_stored_figures():
    bench_gpu = load_script(ROOT / "bench" / "bench_gpu.py")
    for name, pairs in (("bench_gpu_cuda_default", 1000), ("bench_gpu_cuda_base", 5344)):
        res = harness.load(ROOT / "bench" / "results" / f"{name}.json")
        computed = bench_gpu.docs_tables(res["figures"], pairs)
        assert computed["docs_reward"] == res["tables"]["docs_reward"]
        stored = res["tables"]["docs_scoring"]["rows"]
        assert computed["docs_scoring"]["rows"] == stored[:len(computed["docs_scoring"]["rows"])]
        args = types.SimpleNamespace(pairs=pairs, batch_size=64, repeats=10)
        title, tables, body = bench_gpu.report(args, torch.device("cpu"), res["figures"], time.perf_counter())
        rendered = harness.render({"title": title, "provenance": {"command": "c"}, "tables": tables, "body": body})
        assert tables["docs_reward"] == computed["docs_reward"] and "## Tables of the documentation" in rendered


# --- the paired decision rule -------------------------------------------------------------------

@pytest.fixture(scope="module")
def choose():
    return load_script(ROOT / "bench" / "studies" / "choose_finetune_defaults.py")


def test_the_paired_figures_are_the_textbook_ones(choose):
    incumbent, challenger = [0.70, 0.75, 0.65, 0.72], [0.72, 0.76, 0.68, 0.72]
    f = choose.paired(incumbent, challenger, alpha=0.05)
    d = [0.02, 0.01, 0.03, 0.0]
    se = statistics.stdev(d) / 2
    assert f["mean"] == pytest.approx(0.015) and f["se"] == pytest.approx(se)
    assert f["t"] == pytest.approx(0.015 / se) and f["t_crit"] == pytest.approx(2.353363, abs=1e-5)  # t(0.95, 3)
    assert f["p"] == pytest.approx(0.0514, abs=1e-4)  # Student t, 3 degrees of freedom, t = 2.324
    assert f["detectable"] == pytest.approx(f["t_crit"] * se)
    with pytest.raises(ValueError, match="same seeds"):
        choose.paired([0.7, 0.7], [0.7], 0.05)


def test_seed_noise_shared_by_both_candidates_does_not_hide_a_steady_gain(choose):
    seeds = [0.77, 0.78, 0.68, 0.74, 0.71]  # seed-to-seed spread ~0.04, as in the stored runs
    steady = [r + 0.004 + e for r, e in zip(seeds, (0.001, -0.001, 0.0, 0.0005, -0.0005))]
    noisy = [r + d for r, d in zip(seeds, (0.01, 0.009, -0.011, 0.006, -0.002))]  # mean +0.0024, no evidence
    decision = choose.paired_decision(seeds, {"steady": steady, "noisy": noisy}, alpha=0.05)
    assert decision["level"] == 0.025 and decision["best"] == "steady" and decision["adopted"]
    assert not choose.paired_decision(seeds, {"noisy": noisy})["adopted"]
    worse = [r - 0.01 for r in seeds]
    assert not choose.paired_decision(seeds, {"worse": worse})["adopted"]
    identical = choose.paired(seeds, seeds, 0.05)
    assert identical["t"] == 0.0 and not choose.paired_decision(seeds, {"same": seeds})["adopted"]


def test_the_stored_choice_redecided_by_the_paired_rule(choose, tmp_path):
    stored = ROOT / "bench" / "results" / "finetune_defaults_runs.json"
    choose.main(["--redecide", str(stored), "--report", str(tmp_path)])
    res = harness.load(tmp_path / "finetune_defaults_paired.json")
    f = res["figures"]
    assert f["complete"] and not f["changed"] and f["chosen"] == f["incumbent"]
    first = f["stages"][0]["decision"]
    best = first["challengers"][first["best"]]
    assert first["best"] == "layer-6_centering-none_temperature-0.15_lr-0.0002_loss-msepearson_epochs-1"
    assert best["mean"] == pytest.approx(0.0025, abs=1e-4) and best["t"] == pytest.approx(0.38, abs=0.01)
    assert math.isclose(first["level"], 0.05 / 3)
    assert res["tables"] == harness.load(ROOT / "bench" / "results" / "finetune_defaults_paired.json")["tables"]


def test_a_changed_result_leaves_the_tree_clean_and_a_changed_script_does_not(tmp_path, monkeypatch):
    """A benchmark run after another has written its result measures committed code: changes under
    bench/results/ are not uncommitted changes of the tree; any other tracked file's are."""
    import subprocess

    (tmp_path / "bench" / "results").mkdir(parents=True)
    for name in ("bench/results/r.json", "bench/b.py"):
        (tmp_path / name).write_text("0\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "c"]):
        subprocess.run([*git, *args], cwd=tmp_path, check=True)
    monkeypatch.setattr(harness, "REPO", tmp_path)
    assert harness.tree_state()[1] is False
    (tmp_path / "bench/results/r.json").write_text("1\n")
    assert harness.tree_state()[1] is False
    (tmp_path / "bench/b.py").write_text("1\n")
    assert harness.tree_state()[1] is True


def test_outside_git_the_commit_is_the_one_bench_commit_names(tmp_path, monkeypatch):
    """A copy of the tree without its .git (sent to another machine) records the commit it was copied
    from, where the caller names it."""
    monkeypatch.setattr(harness, "REPO", tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # no repository above tmp_path
    monkeypatch.delenv("BENCH_COMMIT", raising=False)
    assert harness.tree_state() == ("unknown", None)
    monkeypatch.setenv("BENCH_COMMIT", "0123abcd" * 5)
    assert harness.tree_state() == ("0123abcd" * 5, None)


@pytest.mark.parametrize("before", [None, "false"])
def test_tokenizer_parallelism_times_each_setting_in_turn_and_restores_the_environment(before, monkeypatch):
    """Each batch is tokenized with TOKENIZERS_PARALLELISM false and true in turn (after a warm-up
    round), as a reward call tokenizes (``word_ids=False``); the variable is as it was afterwards."""
    import os

    import bench_common

    if before is None:
        monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    else:
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", before)
    seen = []

    class Encoder:
        def tokenize(self, texts, *, word_ids=True):
            seen.append((tuple(texts), word_ids, os.environ["TOKENIZERS_PARALLELISM"]))

    rows = bench_common.tokenizer_parallelism(Encoder(), {"two": ["a", "b"], "one": ["c"]}, repeats=3)
    assert seen == [(("a", "b"), False, s) for _ in range(4) for s in ("false", "true")] + \
        [(("c",), False, s) for _ in range(4) for s in ("false", "true")]
    assert [(r["label"], r["texts"]) for r in rows] == [("two", 2), ("one", 1)]
    assert all(r["serial_ms"] > 0 and r["parallel_ms"] > 0 and r["cpus"] >= 1 for r in rows)
    assert all(math.isclose(r["speedup"], r["serial_ms"] / r["parallel_ms"]) for r in rows)
    assert os.environ.get("TOKENIZERS_PARALLELISM") == before


@pytest.mark.parametrize("intervals, busy", [
    ([], 0.0),
    ([(0, 2), (5, 6)], 3.0),                 # apart
    ([(5, 6), (0, 2)], 3.0),                 # in any order
    ([(0, 4), (1, 2), (3, 6)], 6.0),         # nested and overlapping: counted once
    ([(0, 1), (1, 2)], 2.0),                 # touching
])
def test_busy_time_is_the_length_of_the_union_of_the_intervals(intervals, busy):
    import bench_common

    assert bench_common.busy_time(intervals) == busy


def test_reward_inputs_give_each_prompt_its_completions_around_a_small_sample():
    import bench_common

    pairs = [{"hyp": f"h{i}", "ref": f"r{i}"} for i in range(3)]
    hyps, refs, references = bench_common.reward_inputs(pairs, 4, group=2)
    assert references == ["r0", "r1", "r2", "r0"]
    assert hyps == ["h0", "h1", "h2", "h0", "h1", "h2", "h0", "h1"]
    assert refs == ["r0", "r0", "r1", "r1", "r2", "r2", "r0", "r0"]


def test_profile_calls_counts_the_outermost_ops_of_each_call_and_ranks_them():
    """Two calls, each one matmul (its inner ops not counted again) and three adds: 4 ops a call, the
    matmul first by self time; on the CPU there are no device figures. The adds are on a few numbers:
    an add over the matmul's 256 KiB result can cost as much as it, where the allocator maps fresh
    pages for each (as it may, depending on what ran before in the process)."""
    import bench_common

    a, few = torch.randn(256, 256), torch.randn(8)

    def call():
        b, c = a @ a, few
        for _ in range(3):
            c = c + 1
        return b, c

    call()
    p = bench_common.profile_calls(call, repeats=2, device="cpu", top=3)
    assert p["repeats"] == 2 and p["aten_ops"] == 4 and p["wall_s"] > 0
    assert p["kernels"] is None and p["copies"] is None and p["device_busy_s"] is None
    assert p["top"][0]["op"] == "aten::mm" and p["top"][0]["calls"] == 1
    assert {"op": "aten::add", "calls": 3} == {k: v for k, v in next(t for t in p["top"] if t["op"] == "aten::add").items()
                                               if k in ("op", "calls")}
    assert all(t["self_device_s"] is None for t in p["top"])


def test_the_gpu_report_shows_the_profile_of_the_reward_calls(monkeypatch):
    bench_gpu = load_script(ROOT / "bench" / "bench_gpu.py")
    monkeypatch.setattr(bench_gpu, "torch_device_name", lambda device: "a GPU")
    res = harness.load(ROOT / "bench" / "results" / "bench_gpu_cuda_default.json")
    figures = res["figures"]
    top = [{"op": "aten::addmm", "calls": 25.0, "self_host_s": 1e-4, "self_device_s": 2e-4}]
    figures["default"]["profile"] = [
        {"completions": n, "repeats": 10, "wall_s": 0.010, "aten_ops": 281.0, "kernels": 300.0, "copies": 2.0,
         "device_busy_s": 0.004, "top": top} for n in (64, 512)]
    for system in figures["default"]["systems"].values():  # as a run that counted no passes
        for key in ("encoder_passes", "encoder_padded_tokens", "encoder_tokens"):
            system.pop(key, None)
    args = types.SimpleNamespace(pairs=1000, batch_size=64, repeats=10)
    title, tables, body = bench_gpu.report(args, torch.device("cuda"), figures, time.perf_counter())
    assert tables["default_profile"]["rows"][0] == ["64", "10.0", "281", "300", "2", "4.0", "60%"]
    assert tables["default_systems"]["rows"][0][-2:] == ["—", "—"]
    assert tables["default_top_512"]["rows"] == [["`aten::addmm`", "25", "0.10", "0.20"]]
    assert {"table": "default_top_64"} in body
