"""Bad input is refused with one line (CLI: exit status 2, no traceback; API: a ValueError / OSError / TypeError
naming the problem) before anything is allocated, written or deleted (issue 19, items 1-5 and 7)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import greedy_reference, make_target
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

import hf_jetspec
from hf_jetspec import JetSpecHead, bench, limits, models
from hf_jetspec.cli import build_parser, main
from hf_jetspec.tree import DraftTree


def one_error_line(capsys, *needles: str, after_run: bool = False) -> str:
    """The captured stderr: exactly one line (``after_run``: the last line, after the benchmark's progress bar),
    a ``hf-jetspec: error:`` without a traceback, containing ``needles``."""
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err, err
    if after_run:
        assert err.count("error:") == 1, err
        err = err.splitlines()[-1]
    assert "\n" not in err, err
    assert err.startswith("hf-jetspec: error:"), err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


@pytest.fixture
def tiny_args(model_dir):
    return ["--model", str(model_dir / "model"), "--head", str(model_dir / "head")]


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps({"q": text}) for text in ("Hello there", "Say hi")))
    return path


# ---------------------------------------------------------------------------------- 1. convert-gguf data safety


@pytest.fixture
def fake_gguf(model_dir, tmp_path, monkeypatch):
    """A GGUF "file" whose conversion is a tiny random Llama (the real loader takes ~30 s)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir / "model")

    def load(path):
        config = LlamaConfig(vocab_size=128, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1)
        return LlamaForCausalLM(config), tokenizer

    monkeypatch.setattr(models, "load_gguf", load)
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"a tiny fake gguf")
    return path


def user_folder(path, files):
    path.mkdir()
    for name, text in files.items():
        (path / name).write_text(text)
    return path


def contents(path):
    return {p.name: p.read_text() for p in path.iterdir()}


def test_convert_never_touches_files_it_did_not_write(fake_gguf, tmp_path, capsys):
    mine = {"notes.txt": "my notes", "config.json": "{\"mine\": true}"}
    out = user_folder(tmp_path / "mine", mine)
    assert main(["convert-gguf", str(fake_gguf), "--out", str(out)]) == 2
    one_error_line(capsys, "not empty", "not a previous conversion", "--force")
    assert contents(out) == mine
    # --force adds files next to the user's, but never overwrites one it did not write.
    assert main(["convert-gguf", str(fake_gguf), "--out", str(out), "--force"]) == 2
    one_error_line(capsys, "would overwrite config.json", "did not write")
    assert contents(out) == mine
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".mine")]  # no temporary folder left behind
    out2 = user_folder(tmp_path / "mine2", {"notes.txt": "my notes"})
    assert main(["convert-gguf", str(fake_gguf), "--out", str(out2), "--force"]) == 0
    assert (out2 / "notes.txt").read_text() == "my notes" and (out2 / "model.safetensors").is_file()
    assert main(["convert-gguf", str(fake_gguf), "--out", str(tmp_path / "mine" / "notes.txt")]) == 2
    one_error_line(capsys, "is a file")


def test_reconversion_replaces_only_its_own_files(fake_gguf, tmp_path, capsys):
    out = tmp_path / "converted"
    assert main(["convert-gguf", str(fake_gguf), "--out", str(out)]) == 0  # a new folder
    marker = json.loads((out / models.MARKER).read_text())
    assert set(marker["files"]) == {p.name for p in out.iterdir()}
    (out / "my_eval.txt").write_text("results")  # the user adds a file to the converted folder
    stale = out / "tokenizer.json"
    stale.write_text("{}")  # and a file the conversion wrote is damaged
    assert main(["convert-gguf", str(fake_gguf), "--out", str(out)]) == 0  # cached: nothing rewritten
    assert stale.read_text() == "{}"
    assert main(["convert-gguf", str(fake_gguf), "--out", str(out), "--force"]) == 0
    assert (out / "my_eval.txt").read_text() == "results" and stale.read_text() != "{}"
    # A marker from before the file list existed: the conversion's own names count as its files.
    (out / models.MARKER).write_text(json.dumps({"source": "x", "sha256": "0"}))
    assert main(["convert-gguf", str(fake_gguf), "--out", str(out)]) == 0
    assert (out / "my_eval.txt").read_text() == "results"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["convert-gguf", str(fake_gguf), "--out", str(empty)]) == 0 and (empty / models.MARKER).is_file()
    assert main(["convert-gguf", str(tmp_path / "missing.gguf")]) == 2
    one_error_line(capsys, "GGUF file not found")


# ------------------------------------------------------------------------------------------- 2. bounded resources


def test_huge_budgets_are_refused_up_front(capsys):
    assert main(["generate", "--budget", "100000", "hi"]) == 2
    one_error_line(capsys, "--budget", "1..4096", "100000")
    assert main(["bench", "--budgets", "8,100000"]) == 2
    one_error_line(capsys, "--budgets", "1..4096")


def test_api_bounds_tree_width_windows_and_draft_tokens():
    model = make_target("llama")
    prompt = torch.tensor([[5, 6, 7]])
    head = JetSpecHead.for_target(model, block_size=6)
    run = dict(do_sample=False, max_new_tokens=8)
    for kwargs, message in [
        (dict(custom_generate=hf_jetspec.jetspec_generate, draft_head=head, tree_budget=100_000), "tree_budget=100000"),
        (dict(custom_generate=hf_jetspec.jetspec_generate, draft_head=head, tree_width=10**9), "tree_width=10"),
        (dict(custom_generate=hf_jetspec.jacobi_generate, window=10**9), "window=10"),
        (dict(custom_generate=hf_jetspec.jacobi_generate, window=8, ngram_pool=10**6), "ngram_pool=10"),
        (dict(custom_generate=hf_jetspec.speculative_jacobi_generate, draft_model=model, num_draft_tokens=10**6),
         "num_draft_tokens=10"),
    ]:
        with pytest.raises(ValueError, match=message) as err:
            model.generate(prompt, **run, **kwargs)
        assert "4095" in str(err.value) or "4096" in str(err.value)
    with pytest.raises(ValueError, match="at most 4096 nodes"):
        DraftTree(*(torch.zeros(5000, dtype=torch.long) for _ in range(3)), torch.zeros(5000))


def test_memory_bound_names_the_limit(monkeypatch):
    model = make_target("llama")
    monkeypatch.setattr(limits, "available_memory", lambda device: 2**20)  # 1 MiB free
    sequence = 3 + 8
    limit = limits.max_forward_tokens(model, sequence)
    assert limits.forward_bytes(model, limit, sequence + limit) <= 2**19 < \
        limits.forward_bytes(model, limit + 1, sequence + limit + 1)
    with pytest.raises(ValueError, match=f"at most {limit} tokens per forward fit") as err:
        model.generate(torch.tensor([[5, 6, 7]]), do_sample=False, max_new_tokens=8,
                       custom_generate=hf_jetspec.jetspec_generate,
                       draft_head=JetSpecHead.for_target(model, block_size=6), tree_budget=limit + 1)
    assert "GiB" in str(err.value)
    out = model.generate(torch.tensor([[5, 6, 7]]), do_sample=False, max_new_tokens=8,
                         custom_generate=hf_jetspec.jetspec_generate,
                         draft_head=JetSpecHead.for_target(model, block_size=6), tree_budget=limit)
    assert torch.equal(out, greedy_reference(model, torch.tensor([[5, 6, 7]]), max_new_tokens=8))


# ------------------------------------------------------------------------------------------------ 3. head loading


def test_bad_heads_are_one_line(model_dir, tmp_path, capsys):
    base = ["generate", "--model", str(model_dir / "model"), "--max-new-tokens", "2", "hi", "--head"]
    assert main(base + [str(tmp_path / "missing")]) == 2
    assert "Repo id" not in one_error_line(capsys, "no such folder", str(tmp_path / "missing"))
    truncated = tmp_path / "truncated"
    truncated.mkdir()
    for name in ("config.json", "model.safetensors"):
        (truncated / name).write_bytes((model_dir / "head" / name).read_bytes())
    (truncated / "model.safetensors").write_bytes((truncated / "model.safetensors").read_bytes()[:-100])
    assert main(base + [str(truncated)]) == 2
    one_error_line(capsys, "model.safetensors", "not a complete safetensors file")
    config = json.loads((truncated / "config.json").read_text())
    (truncated / "model.safetensors").write_bytes((model_dir / "head" / "model.safetensors").read_bytes())
    (truncated / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 3}))
    assert main(base + [str(truncated)]) == 2
    one_error_line(capsys, "does not match", "config.json", "missing layers.2")
    assert main(["generate", "--model", str(tmp_path / "nope"), "hi"]) == 2
    one_error_line(capsys, "model", "no such folder")


# --------------------------------------------------------------------------------------- 4. benchmark in and out


@pytest.mark.parametrize("line, message", [
    ("[1, 2]", ":2: expected a JSON object, got list"),
    ('"just text"', ":2: expected a JSON object, got str"),
    ('{"q": null, "cat": "a"}', ":2: field 'q' is null"),
    ('{"q": 12, "cat": "a"}', ":2: field 'q' is a int"),
    ('{"q": "", "cat": "a"}', ":2: field 'q' is empty"),
    ('{"q": "ok", "cat": {"a": 1}}', ":2: category field 'cat' is a dict"),
])
def test_every_prompt_is_checked_before_the_run(line, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(models, "load_target", lambda *a: pytest.fail("a model was loaded"))
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"q": "fine", "cat": "a"}) + "\n" + line + "\n")
    assert main(["bench", "--prompts", str(path), "--field", "q", "--category-field", "cat"]) == 2
    one_error_line(capsys, str(path) + message)


def test_output_paths_are_checked_before_the_run(prompts_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(models, "load_target", lambda *a: pytest.fail("a model was loaded"))
    a_file = tmp_path / "some_file"
    a_file.write_text("mine")
    base = ["bench", "--prompts", str(prompts_file), "--field", "q"]
    assert main(base + ["--json", str(a_file / "out.json")]) == 2
    one_error_line(capsys, "--json", "is a file, not a folder")
    assert main(base + ["--plots", str(a_file)]) == 2
    one_error_line(capsys, "--plots", "is a file, expected a folder")
    assert main(base + ["--json", str(tmp_path)]) == 2
    one_error_line(capsys, "--json", "is a folder")
    assert a_file.read_text() == "mine"


def test_a_failed_write_keeps_the_results(model_dir, tiny_args, prompts_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path / "cache"))

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(bench, "write_plots", full_disk)
    out_json = tmp_path / "bench.json"
    out_json.write_text("old results")
    code = main(["bench", *tiny_args, "--prompts", str(prompts_file), "--field", "q", "--max-new-tokens", "3",
                 "--json", str(out_json), "--plots", str(tmp_path / "plots")])
    err = one_error_line(capsys, "--plots", "No space left on device", "the results are saved in", after_run=True)
    assert code == 2
    fallback = err.rsplit("saved in ", 1)[1]
    assert fallback.startswith(str(tmp_path / "cache" / "results"))
    assert json.loads(open(fallback).read())["runs"] == json.loads(out_json.read_text())["runs"]


def test_atomic_write_leaves_the_old_file_on_failure(tmp_path):
    from hf_jetspec.files import write_atomic

    path = tmp_path / "out.json"
    path.write_text("old")

    def fail_midway(tmp):
        tmp.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        write_atomic(path, fail_midway)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.json"]


# --------------------------------------------------------------------------------------------- 5. other crashes


def test_empty_prompt_and_missing_devices(tiny_args, capsys):
    assert main(["generate", *tiny_args, "--no-chat", "--strategy", "ar", ""]) == 2
    one_error_line(capsys, "prompt is empty")
    if not torch.cuda.is_available():
        assert main(["generate", *tiny_args, "--device", "cuda", "hi"]) == 2
        one_error_line(capsys, "'cuda'", "not available")
    assert main(["generate", *tiny_args, "--device", "gpu0", "hi"]) == 2
    one_error_line(capsys, "not a device name")


def test_draft_head_accepts_a_path_and_says_what_else_it_takes(model_dir):
    model, _ = models.load_target(str(model_dir / "model"))
    prompt = torch.tensor([[5, 6, 7, 8]])
    out = model.generate(prompt, do_sample=False, max_new_tokens=6, custom_generate=hf_jetspec.jetspec_generate,
                         draft_head=str(model_dir / "head"))
    assert torch.equal(out, greedy_reference(model, prompt, max_new_tokens=6))
    with pytest.raises(TypeError, match="draft_head must be a JetSpecHead or the folder / Hub id of one, got int"):
        model.generate(prompt, max_new_tokens=2, custom_generate=hf_jetspec.jetspec_generate, draft_head=3)
    with pytest.raises(FileNotFoundError, match="no such folder"):
        model.generate(prompt, max_new_tokens=2, custom_generate=hf_jetspec.jetspec_generate,
                       draft_head=str(model_dir / "missing"))


@pytest.mark.parametrize("name", ["jetspec", "jacobi", "spec-jacobi"])
def test_beam_search_is_named(name):
    model = make_target("llama")
    extra = {"jetspec": {"draft_head": JetSpecHead.for_target(model)}, "jacobi": {},
             "spec-jacobi": {"draft_model": model}}[name]
    with pytest.raises(ValueError, match="Beam search is not supported"):
        model.generate(torch.tensor([[5, 6, 7]]), num_beams=2, max_new_tokens=4,
                       custom_generate=hf_jetspec.DECODING_FUNCTIONS[name], **extra)


# ----------------------------------------------------------------------------------------------- 7. CLI surface


def test_argument_errors_come_before_torch(tmp_path):
    """Argument errors, --help and --version import neither torch nor transformers (measured: ~0.1 s instead of
    ~4 s)."""
    script = ("import sys; from hf_jetspec.cli import main; "
              "codes = [main(a) for a in (['generate', '--budget', '0', 'hi'], ['--version'], ['bench', '--help'], "
              "['generate', '--top-p', '0.9', 'hi'], ['bench', '--strategies', 'ar,nope'])]; "
              "print(codes, 'torch' in sys.modules, 'transformers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip().splitlines()[-1] == "[2, 0, 0, 2, 2] False False", done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "usage:" not in done.stderr


def test_every_flag_has_help_and_both_budget_spellings_work(capsys):
    parser = build_parser()
    assert main(["--version"]) == 0 and capsys.readouterr().out.strip() == f"hf-jetspec {hf_jetspec.__version__}"
    assert main(["--help"]) == 0 and "``" not in capsys.readouterr().out
    subparsers = next(a for a in parser._actions if a.choices and "generate" in a.choices).choices
    for name, sub in subparsers.items():
        for action in sub._actions:
            assert action.help and action.help != "==SUPPRESS==", (name, action.dest)
    assert parser.parse_args(["generate", "--budgets", "8", "hi"]).budget == 8
    assert parser.parse_args(["bench", "--budget", "4,8"]).budgets == [4, 8]
    args = parser.parse_args(["generate", "--temperature", "0.7", "--top-p", "0.9", "--top-k", "5", "--seed", "3",
                              "hi"])
    assert (args.temperature, args.top_p, args.top_k, args.seed) == (0.7, 0.9, 5, 3)


def test_sampling_flags_are_seeded(tiny_args, capsys):
    texts = []
    for _ in range(2):
        assert main(["generate", *tiny_args, "--temperature", "0.9", "--top-p", "0.95", "--top-k", "50", "--seed",
                     "7", "--max-new-tokens", "6", "hi"]) == 0
        texts.append(capsys.readouterr().out.splitlines()[0])
    assert texts[0] == texts[1]
