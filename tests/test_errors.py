"""Bad input is refused with one line (CLI: exit status 2, no traceback; API: a ValueError / OSError / TypeError
naming the problem) before anything is allocated, written or deleted (issue 19, items 1-5 and 7)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from helpers import greedy_reference, make_target
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

import hf_jetspec
from hf_jetspec import JetSpecHead, bench, limits, models
from hf_jetspec.cli import main
from hf_jetspec.cli_parser import build_parser
from hf_jetspec.training import trainer
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


def test_a_length_no_forward_fits_is_named_as_the_length():
    model = make_target("llama")
    head = JetSpecHead.for_target(model, block_size=6)
    for kwargs in (dict(custom_generate=hf_jetspec.jetspec_generate, draft_head=head),
                   dict(custom_generate=hf_jetspec.suffix_generate),
                   dict(custom_generate=hf_jetspec.jacobi_generate, window=4)):
        with pytest.raises(ValueError, match=r"max_length=\d+ \(prompt \+ max_new_tokens\) is too long") as err:
            model.generate(torch.tensor([[5, 6, 7]]), do_sample=False, max_new_tokens=10**15, **kwargs)
        assert "tree_budget" not in str(err.value) and "window" not in str(err.value)


@pytest.mark.parametrize("ids, why", [([[5, -1, 7]], "token id -1, outside"), ([[5, 128, 7]], r"token id 128, outside"),
                                     ([[5.0, 6.0]], "integer token ids, got a torch.float32"),
                                     ([[True, False]], "integer token ids, got a torch.bool")])
def test_ids_that_are_not_the_targets_tokens_are_named(ids, why):
    """Plain generate() fails inside the embedding lookup (IndexError / RuntimeError); every loop, and a batch row,
    names the problem instead."""
    model = hf_jetspec.enable(make_target("llama"))  # vocabulary 128
    head = JetSpecHead.for_target(model, block_size=6)
    for kwargs in (dict(custom_generate=hf_jetspec.jetspec_generate, draft_head=head), dict(assistant_model=head),
                   dict(custom_generate=hf_jetspec.suffix_generate), dict(custom_generate=hf_jetspec.jacobi_generate)):
        for prompt in (torch.tensor(ids), torch.tensor(ids * 2)):
            with pytest.raises(ValueError, match=why):
                model.generate(prompt, do_sample=False, max_new_tokens=4, **kwargs)


def test_saving_a_head_onto_a_file_is_refused(tmp_path):
    """transformers' save_pretrained only logs "should be a directory, not a file" and saves nothing."""
    file = tmp_path / "notes.txt"
    file.write_text("mine")
    with pytest.raises(ValueError, match="writes a folder, but .*notes.txt' is a file"):
        JetSpecHead.for_target(make_target("llama"), block_size=6).save_pretrained(file)
    assert file.read_text() == "mine"


def test_a_target_left_on_the_meta_device_is_refused():
    model = make_target("llama")
    with torch.device("meta"):
        empty = type(model)(model.config)
    for kwargs in (dict(custom_generate=hf_jetspec.jetspec_generate, draft_head=JetSpecHead.for_target(model)),
                   dict(custom_generate=hf_jetspec.suffix_generate),
                   dict(custom_generate=hf_jetspec.jacobi_generate)):
        with pytest.raises(ValueError, match="weights are on the meta device"):
            empty.generate(torch.tensor([[5, 6, 7]]), do_sample=False, max_new_tokens=4, **kwargs)
    with pytest.raises(ValueError, match="load its weights first"):
        JetSpecHead.for_target(empty)


def test_a_head_left_on_the_meta_device_is_refused():
    model = make_target("llama")
    head = JetSpecHead.for_target(model, block_size=6).to("meta")
    with pytest.raises(ValueError, match="draft head's weights are on the meta device"):
        model.generate(torch.tensor([[5, 6, 7]]), do_sample=False, max_new_tokens=4,
                       custom_generate=hf_jetspec.jetspec_generate, draft_head=head)
    with pytest.raises(ValueError, match="draft head's weights are on the meta device"):
        hf_jetspec.enable(model).generate(torch.tensor([[5, 6, 7]]), do_sample=False, max_new_tokens=4,
                                          assistant_model=head)


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


def test_a_head_with_nan_weights_is_refused(model_dir, tmp_path, capsys):
    head = JetSpecHead.from_pretrained(model_dir / "head")
    with torch.no_grad():
        head.fc.weight[0, 0] = float("nan")
        head.layers[0].mlp.down_proj.weight[1, 1] = float("inf")
    head.save_pretrained(tmp_path / "diverged")
    with pytest.raises(ValueError, match=r"fc.weight \(and 1 more tensors\) holds NaN or infinite weights"):
        JetSpecHead.from_pretrained(tmp_path / "diverged")
    capsys.readouterr()
    assert main(["generate", "--model", str(model_dir / "model"), "--max-new-tokens", "2", "hi", "--head",
                 str(tmp_path / "diverged")]) == 2
    one_error_line(capsys, "diverged", "NaN or infinite")


# --------------------------------------------------------------------------------------- 4. benchmark in and out


@pytest.mark.parametrize("line, message", [
    ("[1, 2]", ":2: expected a JSON object, got list"),
    ('"just text"', ":2: expected a JSON object, got str"),
    ('{"q": null, "cat": "a"}', ":2: field 'q' is null"),
    ('{"q": 12, "cat": "a"}', ":2: field 'q' is a int"),
    ('{"q": "", "cat": "a"}', ":2: field 'q' is empty"),
    ('{"q": "ok", "cat": {"a": 1}}', ":2: category field 'cat' is a dict"),
    ('{"q": "again", "cat": "a", "id": 1}', ":2: prompt id '1' repeats line 1's"),
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
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert main(["calibrate", str(empty), "--node-cost", "0.1", "--out", str(a_file)]) == 2  # was "[Errno 17]"
    one_error_line(capsys, "--out", "is a file, expected a folder")
    assert main(["export-vllm", "default", str(a_file)]) == 2
    one_error_line(capsys, "out", "is a file, expected a folder")
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


# ------------------------------------------------------------------- 8. found by a bad-input sweep (4 December)


def test_outputs_never_replace_files_hf_jetspec_did_not_write(model_dir, tmp_path, capsys):
    """export-vllm and train wrote over a user's config.json / model.safetensors / README.md in the folder they
    were given (exit 0). They now refuse such a folder before writing anything; an earlier export or head is
    replaced as before."""
    user = tmp_path / "my-model"
    user.mkdir()
    mine = {name: f"the user's {name}" for name in ("config.json", "model.safetensors", "README.md")}
    for name, text in mine.items():
        (user / name).write_text(text)
    assert main(["export-vllm", str(model_dir / "head"), str(user)]) == 2
    one_error_line(capsys, "already holds", "README.md, config.json, model.safetensors", "nothing was written")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps({"id": i, "input_ids": [5, 6, 7, 8, 9, 10, 11, 12], "prompt_len": 3})
                              for i in range(4)))
    train = ["train", "--data", str(rows), "--model", str(model_dir / "model"), "--max-steps", "1",
             "--batch-size", "2", "--num-anchors", "2", "--block-size", "4", "--head-layers", "1",
             "--eval-count", "0", "--output-dir"]
    assert main(train + [str(user)]) == 2
    one_error_line(capsys, "--output-dir", "already holds", "nothing was written")
    assert {name: (user / name).read_text() for name in mine} == mine and not any(user.glob("checkpoint-*"))
    export = tmp_path / "export"
    for _ in range(2):  # an export folder is this library's own: exporting again replaces it
        assert main(["export-vllm", str(model_dir / "head"), str(export)]) == 0
    assert json.loads((export / "config.json").read_text())["jetspec"]


def test_calibration_writes_keep_a_users_tmp_files(tmp_path):
    """Calibration and record files were written through a fixed ``NAME.tmp``, replacing (and then renaming away)
    a user's file of that name; they now use a unique temporary name."""
    from hf_jetspec.calibration import Calibration, read_records, write_records

    (tmp_path / "calibration.json.tmp").write_text("mine")
    (tmp_path / "records.jsonl.tmp").write_text("mine too")
    Calibration().save(tmp_path)
    write_records(tmp_path / "records.jsonl", [{"kind": "head", "x": [1.0, 0.5, 0.1], "accepted": True}])
    assert (tmp_path / "calibration.json.tmp").read_text() == "mine"
    assert (tmp_path / "records.jsonl.tmp").read_text() == "mine too"
    assert read_records([tmp_path / "records.jsonl"])[0]["accepted"] is True


@pytest.mark.parametrize("rows, message", [
    ("not json\n", "line 1: not JSON"),
    ("[1, 2, 3]\n", "line 1: a row is a JSON object"),
    ('{"id": 1, "prompt_len": 2}\n', "line 1: the row lacks input_ids"),
    ('{"id": 1, "input_ids": [5, 6, "7"], "prompt_len": 2}\n', "input_ids must be a list of token ids"),
    ('{"id": 1, "input_ids": [5, 6, 7], "prompt_len": 9}\n', "prompt_len must be an integer in [0, 3]"),
    ('{"id": 1, "input_ids": [5, 6, 7], "prompt_len": 3}\n', "no training rows"),
    ('{"id": 1, "input_ids": [5, -6, 7, 8], "prompt_len": 2}\n', "outside the target's vocabulary"),
    (b"\xff\xfe\x00", "not UTF-8 text"),
])
def test_training_data_problems_are_one_line(rows, message, model_dir, tmp_path, capsys):
    """`hf-jetspec train` ended in a traceback for every malformed --data file (KeyError, AttributeError,
    torch's "num_samples=0", an IndexError in the target's embedding mid-training)."""
    data = tmp_path / "rows.jsonl"
    data.write_bytes(rows if isinstance(rows, bytes) else rows.encode())
    assert main(["train", "--data", str(data), "--model", str(model_dir / "model"), "--output-dir",
                 str(tmp_path / "out"), "--max-steps", "1", "--eval-count", "0", "--block-size", "4"]) == 2
    one_error_line(capsys, message, after_run=True)  # some checks need the target (its vocabulary) loaded
    assert main(["train", "--data", str(data), "--batch-size", "0", "--output-dir", str(tmp_path / "out")]) == 2
    assert "--batch-size must be >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("option, message", [
    (["--max-steps", "0"], "--max-steps must be >= 1 (or -1: train --epochs), got 0"),  # ran one step
    (["--max-steps", "-5"], "--max-steps must be >= 1"),
    (["--epochs", "0"], "--epochs must be > 0, got 0.0"),  # saved an untrained head as trained
    (["--eval-steps", "0"], "--eval-steps must be >= 1"),
    (["--save-steps", "-1"], "--save-steps must be >= 1"),
    (["--early-stopping", "0"], "--early-stopping must be >= 1"),
    (["--max-prompt-tokens", "0"], "--max-prompt-tokens must be >= 1"),
    (["--draft-vocab", "0"], "--draft-vocab must be >= 1"),
    (["--lr", "0"], "--lr must be > 0"),
    (["--kd-temperature", "0"], "--kd-temperature must be > 0"),
    (["--kd-temperature", "nan"], "--kd-temperature must be > 0, got nan"),
    (["--depth-decay", "-0.5"], "--depth-decay must be > 0"),
    (["--feature-noise", "-0.1"], "--feature-noise must be >= 0"),
    (["--acceptance-loss", "-1"], "--acceptance-loss must be >= 0"),
    (["--warmup-ratio", "1.5"], "--warmup-ratio must be >= 0 and < 1"),
    (["--dropout", "1"], "--dropout must be >= 0 and < 1"),
])
def test_training_numbers_out_of_range_are_named(option, message, tmp_path, capsys):
    """`hf-jetspec train` passed these to the Trainer as they were: `--max-steps 0` trained one step, `--epochs 0`
    saved an untrained head with a model card; now the parser names the option before anything loads."""
    out = tmp_path / "out"
    assert main(["train", "--data", str(tmp_path / "rows.jsonl"), "--output-dir", str(out), *option]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
    assert trainer.parse_args(["--data", "x", "--output-dir", "y", "--max-steps", "3", "--epochs", "0"]).max_steps == 3


@pytest.mark.parametrize("field, value, message", [
    ("num_key_value_heads", 0, "num_key_value_heads must be an integer >= 1"),  # was ZeroDivisionError
    ("num_hidden_layers", "1", "num_hidden_layers must be an integer >= 1, got '1'"),
    ("rope_theta", "10000", "rope_theta must be a number > 0"),
    ("rms_norm_eps", "1e-6", "rms_norm_eps must be a number > 0"),
    ("target_layer_ids", "01", "target_layer_ids must be a list of integers"),  # was read as [0, 1]
    ("block_size", 6.5, "block_size must be an integer"),
    ("causal", "false", "causal must be true or false"),  # was read as True
])
def test_head_configs_with_wrong_types_are_refused(field, value, message, model_dir, tmp_path):
    head = tmp_path / "head"
    head.mkdir()
    (head / "model.safetensors").write_bytes((model_dir / "head" / "model.safetensors").read_bytes())
    config = json.loads((model_dir / "head" / "config.json").read_text())
    (head / "config.json").write_text(json.dumps(config | {field: value}))
    with pytest.raises(ValueError, match=f"config.json: Invalid JetSpecConfig: {message}"):
        JetSpecHead.from_pretrained(head)


def test_damaged_weights_are_named(model_dir, tmp_path, capsys):
    """Integer weights loaded silently (cast to float); a garbage pytorch_model.bin, a truncated model and a model
    config with a field of the wrong type ended in library tracebacks."""
    from safetensors.torch import load_file, save_file

    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text((model_dir / "head" / "config.json").read_text())
    save_file({k: v.to(torch.int32) for k, v in load_file(model_dir / "head" / "model.safetensors").items()},
              head / "model.safetensors")
    with pytest.raises(ValueError, match="are I32, not floating point"):
        JetSpecHead.from_pretrained(head)
    (head / "model.safetensors").unlink()
    (head / "pytorch_model.bin").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="pytorch_model.bin is not a loadable PyTorch checkpoint"):
        JetSpecHead.from_pretrained(head)
    model = tmp_path / "model"
    model.mkdir()
    for path in (model_dir / "model").iterdir():
        (model / path.name).write_bytes(path.read_bytes())
    (model / "model.safetensors").write_bytes((model / "model.safetensors").read_bytes()[:-64])
    assert main(["generate", "--model", str(model), "hi"]) == 2
    one_error_line(capsys, "model.safetensors", "not a complete safetensors file")
    (model / "model.safetensors").write_bytes((model_dir / "model" / "model.safetensors").read_bytes())
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | {"vocab_size": "many"}))
    assert main(["generate", "--model", str(model), "hi"]) == 2
    one_error_line(capsys, "invalid config.json", "vocab_size")


def test_cli_values_that_would_crash_later(tiny_args, tmp_path, capsys):
    """--temperature 1e-300 overflowed the logits (torch.multinomial: inf / nan), --seed 2**70 overflowed torch's
    seed, a prompt of bytes that are not UTF-8 reached the tokenizer, and an empty calibration log was "fitted"."""
    assert main(["generate", *tiny_args, "--temperature", "1e-300", "hi"]) == 2
    one_error_line(capsys, "--temperature", "0 (greedy) or >= 1e-06")
    assert main(["bench", "--temperatures", "0,1e-30"]) == 2
    one_error_line(capsys, "--temperatures")
    assert main(["generate", *tiny_args, "--seed", str(2**70), "--temperature", "1", "hi"]) == 2
    one_error_line(capsys, "--seed", "0..9223372036854775807")
    assert main(["generate", *tiny_args, b"\xff\xfehi".decode("utf-8", "surrogateescape")]) == 2
    one_error_line(capsys, "the prompt is not valid UTF-8 text")
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["calibrate", str(tmp_path / "empty.jsonl"), "--out", str(tmp_path / "cal")]) == 2
    one_error_line(capsys, "no calibration records")
    (tmp_path / "short.jsonl").write_text('{"kind": "head", "x": [1.0], "accepted": true}\n')
    assert main(["calibrate", str(tmp_path / "short.jsonl"), "--out", str(tmp_path / "cal")]) == 2
    one_error_line(capsys, "short.jsonl:1", "x must list the 3 head features")
    assert not (tmp_path / "cal").exists()


def test_api_arguments_of_the_wrong_kind_are_named():
    model = make_target("llama")
    prompt = torch.tensor([[5, 6, 7]])
    head = JetSpecHead.for_target(model, block_size=6)
    run = dict(do_sample=False, max_new_tokens=6)

    class Narrow:  # a custom drafter whose logits cover 64 of the target's 128 tokens
        block_size, layer_ids = 4, []

        def start(self): ...

        def observe(self, features, visited): ...

        def propose(self, ids, depth):
            return torch.zeros(depth, 64)

    for kwargs, message in [
        (dict(custom_generate=hf_jetspec.jetspec_generate, draft_head=head, tree_budget="8"),
         "tree_budget must be an integer, got '8'"),
        (dict(custom_generate=hf_jetspec.jacobi_generate, window="4"), "window must be an integer"),
        (dict(custom_generate=hf_jetspec.jetspec_generate, draft_head=head, calibration={"head": {}}),
         "calibration= takes a hf_jetspec.calibration.Calibration"),
        (dict(custom_generate=hf_jetspec.suffix_generate, calibration_log="records.jsonl"),
         "calibration_log= takes a list"),
        (dict(custom_generate=hf_jetspec.suffix_generate, retrieval_depth="4"), "retrieval_depth must be an integer"),
        (dict(custom_generate=hf_jetspec.speculative_jacobi_generate, draft_model=head),
         "draft_model= takes a loaded causal LM"),
        (dict(custom_generate=hf_jetspec.jetspec_generate, drafter=head, retrieval=False),
         r"drafter= must implement hf_jetspec.drafters.Drafter .* \(a JetSpecHead goes to draft_head=\)"),
        (dict(custom_generate=hf_jetspec.jetspec_generate, drafter=Narrow(), retrieval=False),
         r"Narrow.propose\(ids, depth=3\) must return logits \[depth, 128\] .* shape \[3, 64\]"),
    ]:
        with pytest.raises(ValueError, match=message):
            model.generate(prompt, **run, **kwargs)
    with pytest.raises(ValueError, match="enable\\(\\) takes a loaded transformers model"):
        hf_jetspec.enable("model")
    with pytest.raises(ValueError, match="expected a transformers causal LM"):
        JetSpecHead.for_target("Qwen/Qwen3-8B")


def test_suffix_decoding_names_head_arguments():
    """suffix_generate forwarded every extra keyword to jetspec_generate: ``draft_head=None`` (which generate()'s
    own check lets through) raised "got multiple values for keyword argument", and a drafter given to it directly
    silently became a merged head tree. Now None means what suffix decoding does anyway, anything else is named."""
    model = make_target("llama")
    prompt = torch.tensor([[5, 6, 7, 5, 6, 7]])
    out = model.generate(prompt, do_sample=False, max_new_tokens=8, custom_generate=hf_jetspec.suffix_generate,
                         draft_head=None, retrieval=None)  # None values pass generate()'s model_kwargs check
    assert torch.equal(out, greedy_reference(model, prompt, max_new_tokens=8))
    hf_jetspec.enable(model)  # the assistant_model route had the same collision
    out = model.generate(prompt, do_sample=False, max_new_tokens=8, assistant_model=JetSpecHead.for_target(model),
                         draft_head=None)
    assert torch.equal(out, greedy_reference(model, prompt, max_new_tokens=8))
    config = model.generation_config
    config.max_length = 10
    for name in ("draft_head", "drafter", "sampling_rule", "tree_builder"):
        with pytest.raises(ValueError, match=f"takes no {name}: use"):
            hf_jetspec.suffix_generate(model, prompt, [], [], config, **{name: JetSpecHead.for_target(model)})


def test_timing_forwards_stay_inside_the_position_table():
    """The default node_cost ("auto") times forwards of a 64-token prefix plus up to 32 tokens: on a GPT-2 with 24
    positions (plain generate() works) they indexed past its position embeddings (IndexError)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=24, n_embd=32, n_layer=2, n_head=2)).eval()
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = 0, None
    prompt = torch.tensor([[5, 6, 7, 8, 9, 10]])
    reference = greedy_reference(model, prompt, max_new_tokens=12)
    for loop in (hf_jetspec.jetspec_generate, hf_jetspec.suffix_generate):
        kwargs = dict(draft_head=JetSpecHead.for_target(model, block_size=4)) if loop is hf_jetspec.jetspec_generate \
            else {}
        out = model.generate(prompt, do_sample=False, max_new_tokens=12, custom_generate=loop, **kwargs)
        assert torch.equal(out, reference)


def test_a_truncated_gguf_is_named(tmp_path, capsys):
    """A GGUF cut short (an interrupted download) failed with numpy's "cannot reshape array of size ..." alone."""
    from hf_jetspec.models import find_smollm2_gguf

    with open(find_smollm2_gguf(), "rb") as f:
        (tmp_path / "cut.gguf").write_bytes(f.read(2_000_000))
    assert main(["convert-gguf", str(tmp_path / "cut.gguf"), "--out", str(tmp_path / "out")]) == 2
    one_error_line(capsys, "cut.gguf", "truncated or damaged")
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["cut.gguf"]
