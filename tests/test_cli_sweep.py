"""Property-based sweep over the command line: random combinations of flags and values (valid and not), in random
order, on a tiny random model. Every run must end with exit status 0 or 2, and a 2 with exactly one
``hf-jetspec: error:`` line and no traceback (issue 19). Bounded: a fixed set of examples (derandomized), answers of
at most 6 tokens, ~30-60 s in all."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hf_jetspec.cli import main
from hf_jetspec.cli_parser import GENERATE_STRATEGIES

SWEEP = settings(deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def files(model_dir, tmp_path_factory):
    """Paths the sweep picks from: the tiny model and head, a damaged head, prompt files good and bad, output
    targets writable and not."""
    root = tmp_path_factory.mktemp("sweep")
    damaged = root / "damaged_head"
    damaged.mkdir()
    (damaged / "config.json").write_bytes((model_dir / "head" / "config.json").read_bytes())
    (damaged / "model.safetensors").write_bytes((model_dir / "head" / "model.safetensors").read_bytes()[:-64])
    rows = {"good": ['{"prompt": "Hello", "cat": "a"}', '{"prompt": "Count to three", "cat": "b"}'],
            "not_object": ['{"prompt": "Hello"}', "[1, 2, 3]"], "null": ['{"prompt": null}'], "empty": [""],
            "not_json": ["{prompt: hi"]}
    prompts = {}
    for name, lines in rows.items():
        prompts[name] = root / f"{name}.jsonl"
        prompts[name].write_text("\n".join(lines))
    a_file = root / "a_file"
    a_file.write_text("keep me")
    return {"model": str(model_dir / "model"), "head": str(model_dir / "head"), "damaged": str(damaged),
            "missing": str(root / "missing"), "prompts": {k: str(v) for k, v in prompts.items()},
            "a_file": str(a_file), "root": root}


@st.composite
def command_line(draw, command: str, table: list[tuple[list[list[str]], list[list[str]]]], broken: bool) -> list[str]:
    """``command`` plus one option group from each ``(valid, invalid)`` row of ``table``, in random order; when
    ``broken``, one random row gives an invalid group (so every refusal is exercised next to valid settings)."""
    rows = [row for row, (_, invalid) in enumerate(table) if invalid]
    bad = draw(st.sampled_from(rows)) if broken else None
    groups = [draw(st.sampled_from(invalid if row == bad else valid)) for row, (valid, invalid) in enumerate(table)]
    return [command] + [arg for group in draw(st.permutations(groups)) for arg in group]


def model_rows(files) -> list:
    no_cuda = [] if torch.cuda.is_available() else [["--device", "cuda"]]
    return [
        ([["--model", files["model"]]], [["--model", files["missing"]], ["--model", files["a_file"]]]),
        ([["--head", files["head"]], []], [["--head", files["damaged"]], ["--head", files["missing"]]]),
        ([[]], [["--datastore", files["missing"]], ["--datastore", files["a_file"]]]),
        ([[], ["--dtype", "float32"], ["--dtype", "bfloat16"], ["--dtype", "float16"]], [["--dtype", "int8"]]),
        ([[], ["--device", "cpu"]], [*no_cuda, ["--device", "cuda:7"], ["--device", "gpu"], ["--device", "meta"]]),
        ([[], ["--chat"], ["--no-chat"]], []),
        ([[], ["--verbose"]], []),
    ]


def generate_table(files) -> list:
    return model_rows(files) + [
        ([["--strategy", name] for name in GENERATE_STRATEGIES], [["--strategy", "warp"]]),
        ([["--draft-layers", "1"]], [[], ["--draft-layers", "0"], ["--draft-layers", "99"], ["--draft-layers", "x"]]),
        ([["--max-new-tokens", n] for n in ("1", "3", "6")], [["--max-new-tokens", n] for n in ("0", "-2", "many")]),
        ([[], ["--budget", "1"], ["--budgets", "2"], ["--budget", "8"]],
         [["--budget", "0"], ["--budget", "100000"], ["--budgets", "4,8"]]),
        ([[], ["--temperature", "0"], ["--temperature", "0.7", "--top-p", "0.9"],
          ["--temperature", "1.5", "--top-k", "5", "--seed", "3"],
          ["--seed", "0", "--temperature", "1", "--top-k", "0"]],
         [["--temperature", "-1"], ["--temperature", "nan"], ["--top-p", "0.9"],
          ["--temperature", "1", "--top-p", "0"], ["--temperature", "1", "--top-p", "1.5"],
          ["--temperature", "1", "--top-k", "-1"], ["--seed", "-5"]]),
        ([[], ["--compare", "--repeats", "1"]], [["--compare", "--repeats", "0"]]),
        ([["hi"], [" "], ["日本語で答えて"], ["x" * 120]], [["-x"], [], [""]]),  # "": fine with the chat template
    ]


def bench_table(files) -> list:
    root, prompts = files["root"], files["prompts"]
    return model_rows(files) + [
        ([["--prompts", prompts["good"]], ["--prompts", prompts["good"], "--category-field", "cat"]],
         [["--prompts", prompts[name]] for name in ("not_object", "null", "empty", "not_json")]
         + [["--prompts", files["missing"]], ["--prompts", prompts["good"], "--category-field", "nope"]]),
        ([[], ["--strategies", "ar,jetspec"], ["--strategies", "jacobi-pool,jetspec-oracle"],
          ["--strategies", "ar,spec-jacobi,assisted", "--draft-layers", "1"], ["--strategies", "prompt-lookup"]],
         [["--strategies", "ar,warp"], ["--strategies", "spec-jacobi"], ["--strategies", ""]]),
        ([[], ["--budgets", "4"], ["--budget", "2,8"]],
         [["--budgets", "0"], ["--budgets", "8,x"], ["--budget", "99999"]]),
        ([[], ["--temperatures", "0,0.8"]], [["--temperatures", "-1"], ["--temperatures", "x"]]),
        ([["--limit", "1", "--max-new-tokens", "2"], ["--limit", "1", "--max-new-tokens", "4"]],
         [["--limit", "0"], ["--max-new-tokens", "0"]]),
        ([[], ["--json", str(root / "out" / "r.json")]],
         [["--json", files["a_file"] + "/r.json"], ["--json", str(root)]]),
        ([[], ["--plots", str(root / "plots")]], [["--plots", files["a_file"]]]),
        ([[], ["--per-category"]], []),
    ]


def check_run(argv, capsys) -> int:
    code = main(argv)  # an exception escaping main would be a traceback
    err = capsys.readouterr().err
    assert "Traceback" not in err, (argv, err)
    assert code in (0, 2), (argv, code, err[-3000:])
    if code == 2:
        errors = [line for line in err.splitlines() if "hf-jetspec: error:" in line]
        assert len(errors) == 1 and err.rstrip().splitlines()[-1] == errors[0], (argv, err[-3000:])
    return code


@pytest.mark.parametrize("command, table, broken, examples", [
    ("generate", generate_table, False, 30), ("generate", generate_table, True, 50),
    ("bench", bench_table, False, 12), ("bench", bench_table, True, 20),
])
def test_every_command_line_exits_0_or_2(command, table, broken, examples, files, capsys):
    """Valid combinations succeed (0); with one invalid value a run is refused with one line (2), or succeeds
    where that value does not matter (e.g. --draft-layers 99 for a strategy without a draft)."""
    codes = []

    @settings(SWEEP, max_examples=examples)
    @given(command_line(command, table(files), broken))
    def run(argv):
        code = check_run(argv, capsys)
        assert broken or code == 0, argv
        codes.append(code)

    run()
    assert not broken or codes.count(2) >= examples // 2, codes
