"""hf-jetspec command line: generate streams, bench writes JSON and plots and catches mismatches, train runs,
and bad arguments give one-line errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_jetspec import JetSpecHead, bench, cli
from hf_jetspec.cli import main
from hf_jetspec.cpu import mkl_code_path


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    rows = [{"q": "Hello there", "cat": "greet"}, {"q": "What is 2+2?", "cat": "math"}, {"q": "Say hi", "cat": "greet"}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_generate_streams_and_reports(model_dir, capsys):
    assert main(["generate", "--model", str(model_dir / "model"), "--head", str(model_dir / "head"),
                 "--max-new-tokens", "12", "--compare", "--repeats", "3", "Tell me a story"]) == 0
    captured = capsys.readouterr()
    assert "tokens/s" in captured.out and "tau" in captured.out and "identical to plain greedy" in captured.out
    assert "median of 3; spread" in captured.out and "medians of 3 interleaved runs" in captured.out
    assert "warming up jetspec and plain generate" in captured.err  # progress while nothing is printed yet
    assert "cut at --max-new-tokens 12" in captured.err
    assert "Loading weights" not in captured.err  # transformers' bars only with --verbose
    for strategy in ("ar", "jacobi"):
        assert main(["generate", "--model", str(model_dir / "model"), "--strategy", strategy,
                     "--max-new-tokens", "8", "hi"]) == 0
        assert f"[{strategy}]" in capsys.readouterr().out
    assert main(["generate", "--model", str(model_dir / "model"), "--strategy", "ar", "--verbose",
                 "--max-new-tokens", "2", "hi"]) == 0
    assert "Loading weights" in capsys.readouterr().err


def test_generate_on_a_sliding_window_model_without_sdpa(model_dir, tmp_path, capsys):
    """A Gemma 2 folder (sliding-window layers mixed with full ones; soft-capping, so no sdpa: the loader keeps
    transformers' own attention choice) decodes losslessly from the command line."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir / "model")
    config = AutoConfig.for_model("gemma2", vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=3,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64,
                                  sliding_window=6, initializer_range=0.2, eos_token_id=tokenizer.eos_token_id,
                                  layer_types=["sliding_attention", "full_attention", "sliding_attention"])
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "gemma2")
    tokenizer.save_pretrained(tmp_path / "gemma2")
    for strategy in ("jetspec", "suffix"):
        assert main(["generate", "--model", str(tmp_path / "gemma2"), "--strategy", strategy, "--max-new-tokens",
                     "24", "--compare", "--repeats", "1", "Tell me a story"]) == 0
        assert "identical to plain greedy" in capsys.readouterr().out


def test_compare_names_reduced_precision_drift(model_dir, monkeypatch, capsys):
    """A --compare output that differs from plain greedy is drift in bf16 (exit 0) and a bug in float32 (exit
    1)."""
    real = cli.timed_generate

    def drifting(model, ids, kwargs, seed):
        sequences, seconds, stats = real(model, ids, kwargs, seed)
        if "custom_generate" in kwargs:  # the strategy's runs: change the last token
            sequences = sequences.clone()
            sequences[0, -1] = (sequences[0, -1] + 1) % model.config.vocab_size
        return sequences, seconds, stats

    monkeypatch.setattr(cli, "timed_generate", drifting)
    args = ["generate", "--model", str(model_dir / "model"), "--head", str(model_dir / "head"), "--max-new-tokens",
            "5", "--compare", "--repeats", "1", "hi"]
    assert main(args + ["--dtype", "bfloat16"]) == 0
    assert "after 4 identical tokens: expected reduced-precision drift in bfloat16" in capsys.readouterr().out
    assert main(args) == 1
    assert "DIFFERENT from plain greedy generate after 4 identical tokens" in capsys.readouterr().out


def test_text_printer_flushes_every_step(model_dir):
    """Text without spaces prints as it arrives (TextStreamer waits for a space); a character split across tokens
    is held back until complete, never printed as U+FFFD."""
    import io

    from transformers import AutoTokenizer

    from hf_jetspec.streaming import TextPrinter

    tokenizer = AutoTokenizer.from_pretrained(model_dir / "model")
    text = "https://example.com/averyveryverylongpathwithoutanyspaces😀done"
    tokens = tokenizer(text)["input_ids"]
    stream = io.StringIO()
    printer = TextPrinter(tokenizer, stream=stream)
    printer.put(torch.tensor([[1, 2, 3]]))  # the prompt: skipped
    seen = []
    for token in tokens:
        printer.put(torch.tensor([token]))
        seen.append(stream.getvalue())
    printer.end()
    assert stream.getvalue() == text + "\n"
    assert all("\ufffd" not in s for s in seen)
    assert len(set(seen)) > len(tokens) // 2  # most steps printed something
    assert seen[len(tokens) // 2] and text.startswith(seen[len(tokens) // 2])


def test_bench_writes_json_and_plots(model_dir, prompts_file, tmp_path, capsys):
    out_json, plots = tmp_path / "bench.json", tmp_path / "plots"
    code = main(["bench", "--model", str(model_dir / "model"), "--head", str(model_dir / "head"),
                 "--prompts", str(prompts_file), "--field", "q", "--category-field", "cat", "--limit", "1",
                 "--max-new-tokens", "10",
                 "--strategies", "ar,jetspec,jetspec-oracle,prompt-lookup,jacobi,jacobi-pad,jacobi-pool",
                 "--budgets", "4,8", "--json", str(out_json), "--plots", str(plots)])
    assert code == 0, capsys.readouterr().err
    payload = json.loads(out_json.read_text())
    assert set(payload["per_category"]) == {"greet", "math"}
    for name in ("ar", "jetspec@4", "jetspec@8", "jetspec-oracle@4", "prompt-lookup", "jacobi", "jacobi-pad",
                 "jacobi-pool"):
        stats = payload["strategies"][name]
        assert {"tau", "tokens_per_s", "speedup", "matches_greedy"} <= set(stats)
        assert stats["matches_greedy"] is True
    assert payload["strategies"]["jetspec-oracle@8"]["tau"] > 1.5
    assert payload["machine"]["torch"] and payload["settings"]["max_new_tokens"] == 10
    curve = payload["machine"]["cost_curve"]  # what the merged trees' adaptive sizes were priced with
    assert curve["tokens"][:2] == [1, 2] and curve["tokens"][-1] >= 8 and curve["cost"][0] == 1.0
    assert curve["cost"] == sorted(curve["cost"]) and len(curve["cost"]) == len(curve["tokens"])
    assert "the adaptive trees were sized with: 1:1.00 2:" in capsys.readouterr().out
    assert payload["settings"]["budgets"] == "4,8" and payload["settings"]["temperatures"] == "0"
    assert {p.name for p in plots.iterdir()} >= {"speedup_per_category.png", "tau_per_category.png",
                                                  "tau_vs_budget.png"}


def test_console_command_tunes_mkl_and_stays_exact(model_dir, prompts_file, tmp_path):
    """The installed `hf-jetspec` command, in its own process, pins MKL's code path where that helps
    (`hf_jetspec.cpu`) and records it; every strategy still returns plain greedy's tokens under it."""
    out_json = tmp_path / "bench.json"
    command = [str(Path(sys.executable).with_name("hf-jetspec")), "bench", "--model", str(model_dir / "model"),
               "--head", str(model_dir / "head"), "--prompts", str(prompts_file), "--field", "q", "--limit", "2",
               "--max-new-tokens", "16", "--strategies", "ar,jetspec,jacobi", "--budgets", "4,16",
               "--json", str(out_json)]
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    subprocess.run(command, check=True, env=env, capture_output=True, timeout=600)
    payload = json.loads(out_json.read_text())
    assert payload["machine"]["mkl_cbwr"] == mkl_code_path()
    assert all(s["matches_greedy"] is True for s in payload["strategies"].values())


def test_draft_layers_give_a_truncated_draft(model_dir, prompts_file, tmp_path, capsys):
    """--draft-layers K: the target's first K layers draft for spec-jacobi and HF assisted generation."""
    assert main(["generate", "--model", str(model_dir / "model"), "--strategy", "spec-jacobi", "--draft-layers", "1",
                 "--max-new-tokens", "8", "--compare", "hi"]) == 0
    assert "identical to plain greedy" in capsys.readouterr().out
    out_json = tmp_path / "bench.json"
    assert main(["bench", "--model", str(model_dir / "model"), "--prompts", str(prompts_file), "--field", "q",
                 "--limit", "1", "--max-new-tokens", "8", "--strategies", "ar,assisted,spec-jacobi",
                 "--draft-layers", "1", "--json", str(out_json)]) == 0
    strategies = json.loads(out_json.read_text())["strategies"]
    assert strategies["assisted"]["matches_greedy"] and strategies["spec-jacobi"]["matches_greedy"]


def test_bench_catches_a_wrong_token(model_dir, prompts_file, monkeypatch, capsys):
    real = bench.run_strategy

    def corrupt(model, ids, strategy, *args, **kwargs):
        out = real(model, ids, strategy, *args, **kwargs)
        if strategy.kind == "jacobi":  # a strategy that returns one wrong token
            sequence = out[0].clone()
            sequence[0, -1] = (sequence[0, -1] + 1) % model.config.vocab_size
            return (sequence, *out[1:])
        return out

    monkeypatch.setattr(bench, "run_strategy", corrupt)
    code = main(["bench", "--model", str(model_dir / "model"), "--prompts", str(prompts_file), "--field", "q",
                 "--limit", "1", "--max-new-tokens", "6", "--strategies", "ar,jacobi"])
    captured = capsys.readouterr()
    assert code == 1
    assert "MISMATCH" in captured.err and "DIFFERS" in captured.out
    assert "after 5 identical new tokens" in captured.err  # the 6th (last) token was changed


def test_first_difference():
    t = torch.tensor
    assert bench.first_difference(t([1, 2, 3]), t([1, 2, 4])) == 2
    assert bench.first_difference(t([5, 2, 3]), t([1, 2, 3])) == 0
    assert bench.first_difference(t([1, 2]), t([1, 2, 3])) == 2  # stopped early, e.g. at an eos
    assert bench.first_difference(t([1, 2, 3]), t([1, 2, 3])) == 3


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "--prompts", "/nonexistent.jsonl"], "not found"),
        (["bench", "--prompts", "PROMPTS", "--field", "nope"], "no field 'nope'"),
        (["bench", "--prompts", "PROMPTS", "--field", "q", "--strategies", "ar,warp"], "Unknown strategy 'warp'"),
        (["bench", "--prompts", "PROMPTS", "--field", "q", "--budgets", "8,x"], "--budgets"),
        (["generate", "--strategy", "spec-jacobi", "--draft-model", "d", "--draft-layers", "2", "hi"], "not both"),
    ],
)
def test_bad_arguments_give_one_line_errors(argv, message, prompts_file, capsys):
    argv = [str(prompts_file) if a == "PROMPTS" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hf-jetspec: error:") and message in err and "\n" not in err and "Traceback" not in err


def _training_data(model_dir, tmp_path, count=8):
    """(target, rows, JSONL path): ``count`` rows of the tiny target's own greedy answers to random prompts."""
    from hf_jetspec.models import load_target

    target, _ = load_target(str(model_dir / "model"), "float32", None)
    rows = []
    gen = torch.Generator().manual_seed(0)
    for i in range(count):
        prompt = torch.randint(3, 1000, (1, 4), generator=gen)
        out = target.generate(prompt, do_sample=False, max_new_tokens=12)
        rows.append({"id": f"row{i}", "input_ids": out[0].tolist(), "prompt_len": 4})
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    return target, rows, data


def test_train_command(model_dir, tmp_path, capsys):
    target, rows, data = _training_data(model_dir, tmp_path)
    out_dir = tmp_path / "head"
    args = ["train", "--data", str(data), "--model", str(model_dir / "model"), "--output-dir", str(out_dir),
                 "--max-steps", "3", "--batch-size", "2", "--num-anchors", "4", "--block-size", "4",
                 "--head-layers", "1", "--eval-count", "1", "--eval-steps", "100", "--logging-steps", "1",
                 "--save-steps", "2", "--draft-vocab", "64"]
    assert main(args) == 0
    head = JetSpecHead.from_pretrained(out_dir)
    summary = head.config.training_summary
    assert summary["steps"] == 3 and "tau_held_out" in summary
    assert "tau" in (out_dir / "README.md").read_text()
    assert len(head.config.draft_vocab) == 64 and "draft_vocab" in summary
    # Resuming continues from the newest checkpoint (step 2) to the new step limit.
    assert (out_dir / "checkpoint-2").is_dir()
    assert main([*args[:args.index("--max-steps")], "--max-steps", "5", *args[args.index("--max-steps") + 2:],
                 "--resume-from-checkpoint", "last"]) == 0
    assert JetSpecHead.from_pretrained(out_dir).config.training_summary["steps"] == 5


def test_train_command_reads_several_feature_stores(model_dir, tmp_path, capsys):
    """`--features A B`: every stored sequence trains (also ones no --data file lists) except the evaluation rows;
    stores tapping other layers, or a missing one among several, are refused."""
    from hf_jetspec.config import default_target_layer_ids
    from hf_jetspec.training.features import build_feature_store

    target, rows, data = _training_data(model_dir, tmp_path)
    taps = default_target_layer_ids(target.config.num_hidden_layers, 3)
    extra = [{**r, "id": f"extra{i}"} for i, r in enumerate(rows[:3])]  # stored only, in no --data file
    build_feature_store(target, rows[:5], taps, tmp_path / "a")
    build_feature_store(target, rows[5:] + extra, taps, tmp_path / "b")
    args = ["train", "--data", str(data), "--model", str(model_dir / "model"), "--output-dir", str(tmp_path / "h"),
            "--max-steps", "1", "--batch-size", "2", "--num-anchors", "2", "--block-size", "4", "--head-layers", "1",
            "--eval-count", "2", "--eval-steps", "100", "--save-steps", "100", "--features"]
    assert main(args + [str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    summary = JetSpecHead.from_pretrained(tmp_path / "h").config.training_summary
    assert summary["sequences"] == 8 - 2 + 3
    build_feature_store(target, rows[:2], taps[:1], tmp_path / "c")
    assert main(args + [str(tmp_path / "a"), str(tmp_path / "c")]) == 2  # one line on stderr, no traceback
    assert "same layers" in capsys.readouterr().err.splitlines()[-1]
    assert main(args + [str(tmp_path / "a"), str(tmp_path / "missing")]) == 2  # one line on stderr, no traceback
    assert "not found" in capsys.readouterr().err.splitlines()[-1]


def test_feature_stores_read_each_sequence_once_and_build_skips_stored_rows(model_dir, tmp_path):
    """A sequence stored twice (two stores, or a generator restarted mid-batch) is read once, from the first store;
    `python -m hf_jetspec.training.features --skip-stored` builds states only for rows no given store holds."""
    import torch

    from hf_jetspec.config import default_target_layer_ids
    from hf_jetspec.training.features import FeatureStore, build_feature_store
    from hf_jetspec.training.features import main as features_main

    target, rows, data = _training_data(model_dir, tmp_path)
    taps = default_target_layer_ids(target.config.num_hidden_layers, 3)
    build_feature_store(target, rows[:5], taps, tmp_path / "a", shard_size=2)
    changed = [{**r, "input_ids": r["input_ids"][:-1]} for r in rows[3:6]]  # ids row3-row5, other contents
    build_feature_store(target, changed, taps, tmp_path / "b")
    store = FeatureStore(tmp_path / "a", tmp_path / "b")
    assert len(store) == 6 and store.duplicates == 2
    assert store.ids == {f"row{i}" for i in range(6)}
    lengths = sorted(len(store[i]["input_ids"]) for i in range(6))
    assert lengths == sorted([len(r["input_ids"]) for r in rows[:5]] + [len(rows[5]["input_ids"]) - 1])
    assert len(FeatureStore(tmp_path / "b", tmp_path / "a")) == 6  # either order: each id once

    assert features_main(["--data", str(data), "--out", str(tmp_path / "rest"), "--layers", *map(str, taps),
                          "--eval-count", "0", "--model", str(model_dir / "model"),
                          "--skip-stored", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    rest = FeatureStore(tmp_path / "rest")
    assert rest.ids == {"row6", "row7"}
    item = next(rest[i] for i in range(2) if rest[i]["input_ids"].tolist() == rows[6]["input_ids"])
    assert item["prompt_len"] == 4
    assert item["features"].shape == (len(rows[6]["input_ids"]), len(taps) * target.config.hidden_size)
    assert torch.isfinite(item["features"].float()).all()
    both = FeatureStore(tmp_path / "a", tmp_path / "b", tmp_path / "rest")
    assert len(both) == 8 and both.duplicates == 2


def test_bench_calibration_log_then_calibrate(model_dir, prompts_file, tmp_path, capsys):
    """bench --calibration-log records the merged trees' verified nodes; calibrate fits them into calibration.json
    (which a head folder then carries); bad logs and node costs are one-line errors."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_jetspec.calibration import CALIBRATION_FILE, Calibration, read_records
    from hf_jetspec.prompts import encode_prompt
    from hf_jetspec.suffix_index import CorpusIndex

    model = AutoModelForCausalLM.from_pretrained(model_dir / "model")
    tokenizer = AutoTokenizer.from_pretrained(model_dir / "model")
    texts = [json.loads(line)["q"] for line in prompts_file.read_text().splitlines()]
    answers = []
    for text in texts:  # the corpus holds the target's own answers (accepted) and random text (rejected)
        ids = encode_prompt(tokenizer, text)
        answers.append(model.generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[1]:].tolist())
    noise = torch.randint(0, len(tokenizer), (40, 30), generator=torch.Generator().manual_seed(0)).tolist()
    # The first prompt's answer as it is; the others' openings with wrong continuations (rejected once verified).
    corpus = [answers[0]] + [a[:4] + n for a, n in zip(answers[1:], noise)] + noise[len(answers):]
    CorpusIndex.build(corpus, len(tokenizer)).save(tmp_path / "store")
    drafter = tmp_path / "drafter"  # the test head with a stored node cost of 0: trees always fill the budget
    shutil.copytree(model_dir / "head", drafter)
    Calibration(node_cost=0.0).save(drafter)

    log, head = tmp_path / "log.jsonl", tmp_path / "head"
    assert main(["bench", "--model", str(model_dir / "model"), "--head", str(drafter),
                 "--datastore", str(tmp_path / "store"), "--prompts", str(prompts_file), "--field", "q",
                 "--max-new-tokens", "24", "--strategies", "ar,jetspec", "--budgets", "8",
                 "--calibration-log", str(log), "--json", str(tmp_path / "bench.json")]) == 0
    records = read_records([log])
    retrieval = [r for r in records if r["kind"] == "retrieval"]
    assert len(retrieval) >= 20 and {r["accepted"] for r in retrieval} == {True, False}
    out = capsys.readouterr().out
    assert "verification records" in out
    # The stored cost priced the trees, not a measured curve: the results say so.
    assert "prices a tree of N nodes at 1 + 0 N forwards" in out
    assert json.loads((tmp_path / "bench.json").read_text())["machine"]["head_node_cost"] == 0.0

    assert main(["calibrate", str(log), "--out", str(head), "--node-cost", "0.03"]) == 0
    calibration = Calibration.load(head / CALIBRATION_FILE)
    assert calibration.fitted_on["retrieval"] == len(retrieval) and calibration.node_cost == 0.03
    assert calibration.retrieval != Calibration().retrieval

    for bad, message in ((["calibrate", str(tmp_path / "missing.jsonl"), "--out", str(head)], "no such file"),
                         (["calibrate", str(log), "--out", str(head), "--node-cost", "cheap"], "--node-cost"),
                         (["calibrate", str(prompts_file), "--out", str(head)], "not a calibration record")):
        assert main(bad) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1


def test_train_command_logs_the_memorisation_gap(model_dir, tmp_path, capsys):
    """--eval-train-count N evaluates the chain tau of N rows the head trains on next to the held-out rows at every
    evaluation: the logged gap is their difference and the summary's trained chain tau is diagnose's measure of
    the saved head on those rows."""
    from hf_jetspec.training.diagnose import depth_accuracy
    from hf_jetspec.training.features import split_rows

    target, rows, data = _training_data(model_dir, tmp_path)
    out_dir = tmp_path / "head"
    args = ["train", "--data", str(data), "--model", str(model_dir / "model"), "--output-dir", str(out_dir),
            "--max-steps", "4", "--batch-size", "2", "--num-anchors", "4", "--block-size", "4", "--head-layers", "1",
            "--eval-count", "2", "--eval-decode-count", "0", "--eval-steps", "2", "--logging-steps", "1",
            "--eval-train-count", "100"]  # more than there are: every trained row
    assert main(args) == 0
    summary = JetSpecHead.from_pretrained(out_dir).config.training_summary
    history = json.loads((out_dir / "log_history.json").read_text())
    evals = [h for h in history if "eval_train_chain_tau" in h]
    assert len(evals) >= 2 and all(h["eval_train_chain_tau"] >= 1.0 for h in evals)
    for h in evals:
        assert h["eval_chain_tau_gap"] == pytest.approx(h["eval_train_chain_tau"] - h["eval_chain_tau"])
    trained, _ = split_rows([rows], 2, 0)
    head = JetSpecHead.from_pretrained(out_dir)
    measured = depth_accuracy(head, target, trained, 4)["chain_tau"]
    assert summary["chain_tau_trained"] == pytest.approx(measured, abs=1e-3)
    assert "trained chain tau" in capsys.readouterr().out
    assert main([*args, "--eval-train-count", "-1"]) == 2
    assert "--eval-train-count must be >= 0" in capsys.readouterr().err

    # --eval-reference: a head that saw neither set measures how much easier the trained rows are, and
    # eval_memorisation is the excess over that (tested here for its arithmetic, with a head that taps other layers
    # and trained on every row: on these few random-model rows only such a head accepts anything)
    held_rows = split_rows([rows], 2, 0)[1]
    reference = tmp_path / "reference"
    assert main(["train", "--data", str(data), "--model", str(model_dir / "model"), "--output-dir", str(reference),
                 "--max-steps", "150", "--batch-size", "4", "--num-anchors", "8", "--block-size", "4",
                 "--head-layers", "1", "--taps", "1", "--lr", "3e-3", "--eval-count", "0", "--seed", "1"]) == 0
    ref = JetSpecHead.from_pretrained(reference)
    assert ref.config.target_layer_ids != head.config.target_layer_ids
    ref_held = depth_accuracy(ref, target, held_rows, 4)["chain_tau"]
    ref_trained = depth_accuracy(ref, target, trained, 4)["chain_tau"]
    assert ref_held > 1.02  # it learned enough to scale by
    capsys.readouterr()
    assert main([*args, "--eval-reference", str(reference)]) == 0
    history = json.loads((out_dir / "log_history.json").read_text())
    evals = [h for h in history if "eval_memorisation" in h]
    assert len(evals) >= 2
    for h in evals:
        assert (h["eval_reference_chain_tau"], h["eval_reference_train_chain_tau"]) == pytest.approx(
            (ref_held, ref_trained), abs=1e-4)
        expected = 1 + (h["eval_chain_tau"] - 1) * (ref_trained - 1) / (ref_held - 1)
        assert h["eval_memorisation"] == pytest.approx(h["eval_train_chain_tau"] - expected, abs=1e-4)
    summary = JetSpecHead.from_pretrained(out_dir).config.training_summary
    assert summary["memorisation"]["trained_minus_composition"] == pytest.approx(
        evals[-1]["eval_memorisation"], abs=1e-3)
    assert "memorisation (trained chain tau above" in capsys.readouterr().out
    # a reference that accepts nothing cannot measure composition; one made for another target is refused
    torch.manual_seed(1)
    JetSpecHead.for_target(target, num_hidden_layers=1, block_size=4).save_pretrained(tmp_path / "untrained")
    assert main([*args, "--eval-reference", str(tmp_path / "untrained")]) == 2
    assert "accepts too little" in capsys.readouterr().err.strip().splitlines()[-1]
    ref.config.target_num_layers += 1
    ref.save_pretrained(reference)
    assert main([*args, "--eval-reference", str(reference)]) == 2
    assert "layers != head's" in capsys.readouterr().err.strip().splitlines()[-1]
    assert main([*args, "--eval-train-count", "0", "--eval-reference", str(reference)]) == 2
    assert "give --eval-count and --eval-train-count" in capsys.readouterr().err


def test_train_command_regularisation_and_early_stopping(model_dir, tmp_path, capsys):
    """Feature noise, dropout, the acceptance loss, fixed anchors and prompt capping train and are recorded; early
    stopping evaluates the held-out chain tau and keeps the best checkpoint."""
    target, rows, data = _training_data(model_dir, tmp_path)
    out_dir = tmp_path / "head"
    args = ["train", "--data", str(data), "--model", str(model_dir / "model"), "--output-dir", str(out_dir),
            "--max-steps", "6", "--batch-size", "2", "--num-anchors", "4", "--block-size", "4", "--head-layers", "1",
            "--eval-count", "2", "--eval-decode-count", "1", "--eval-steps", "2", "--logging-steps", "1",
            "--feature-noise", "0.1", "--dropout", "0.1", "--acceptance-loss", "0.5", "--fixed-anchors",
            "--max-prompt-tokens", "3", "--early-stopping", "1"]
    assert main(args) == 0
    head = JetSpecHead.from_pretrained(out_dir)
    summary = head.config.training_summary
    assert summary["regularisation"] == {"feature_noise": 0.1, "dropout": 0.1, "acceptance_loss": 0.5,
                                         "fixed_anchors": True, "early_stopping_patience": 1,
                                         "max_prompt_tokens": 3}
    assert head.config.dropout == 0.1
    state = json.loads(sorted(out_dir.glob("checkpoint-*/trainer_state.json"))[-1].read_text())
    taus = [h["eval_chain_tau"] for h in state["log_history"] if "eval_chain_tau" in h]
    assert taus and all(t >= 1.0 for t in taus)
    assert state["best_metric"] == max(taus)
    assert main([*args, "--dropout", "1.5"]) == 2  # one line on stderr, no traceback
    assert "--dropout must be >= 0 and < 1, got 1.5" in capsys.readouterr().err.splitlines()[-1]
    # A head trained further records what it continued from.
    more = ["train", "--data", str(data), "--model", str(model_dir / "model"), "--output-dir", str(tmp_path / "more"),
            "--max-steps", "1", "--batch-size", "2", "--num-anchors", "4", "--eval-count", "1",
            "--eval-decode-count", "0", "--init-head", str(out_dir)]
    assert main(more) == 0
    later = JetSpecHead.from_pretrained(tmp_path / "more").config.training_summary
    assert later["steps"] == 1 and later["continued_from"] == {"head": str(out_dir), **summary}
    assert "chain_tau_held_out" in later and "tau_held_out" not in later
    # A fresh head can start from the target's top layers (recorded); not together with --init-head.
    fresh = ["train", "--data", str(data), "--model", str(model_dir / "model"), "--output-dir",
             str(tmp_path / "fresh"), "--max-steps", "1", "--batch-size", "2", "--num-anchors", "4", "--eval-count", "1",
             "--eval-decode-count", "0", "--head-layers", "2", "--init-from-target"]
    assert main(fresh) == 0
    started = JetSpecHead.from_pretrained(tmp_path / "fresh").config.training_summary["initialised_from"]
    assert started.startswith(f"the target's decoder layers [{target.config.num_hidden_layers - 2}, ")
    assert main([*fresh, "--init-head", str(out_dir)]) == 2  # the trainer's own argparse error, before loading
    assert "--init-head and --init-from-target" in capsys.readouterr().err


def test_compare_explains_a_result_below_plain_generate(model_dir, monkeypatch, capsys):
    """Below 1x the comparison says why (with the run's tau) instead of leaving a bare number; at or above 1x it
    says nothing more."""
    real = cli.timed_generate

    def timed(slower):
        def run(model, ids, kwargs, seed):
            sequences, seconds, stats = real(model, ids, kwargs, seed)
            return sequences, (2.0 if "custom_generate" in kwargs and slower else 1.0), stats
        return run

    args = ["generate", "--model", str(model_dir / "model"), "--head", str(model_dir / "head"), "--max-new-tokens",
            "5", "--compare", "--repeats", "1", "hi"]
    monkeypatch.setattr(cli, "timed_generate", timed(slower=True))
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "speedup 0.50x" in captured.out
    assert "note: below 1x here" in captured.err and "tau " in captured.err and "section 9" in captured.err
    monkeypatch.setattr(cli, "timed_generate", timed(slower=False))
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "speedup 1.00x" in captured.out and "below 1x" not in captured.err
