"""Tests for hf_jetspec.training.sources (prompt sources, deduplication, the code/math evaluation set) and
hf_jetspec.training.answers (the chunked answer store)."""

import json
import warnings
from collections import Counter

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, GenerationConfig

from hf_jetspec.models import convert_gguf, find_smollm2_gguf
from hf_jetspec.prompts import CODE_MATH_EVAL, load_prompts
from hf_jetspec.training import answers, data, sources
from hf_jetspec.training.features import read_rows


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(convert_gguf(find_smollm2_gguf()))


def _conversation(cid, *turns, opening="human"):
    roles = ["human", "gpt"] if opening == "human" else ["gpt", "human"]
    return {"id": cid, "conversations": [{"from": roles[i % 2], "value": t} for i, t in enumerate(turns)]}


def _user(text):
    return [{"role": "user", "content": text}]


def _problem(directory, slug, description, **extra):
    p = {"problem_name": slug, "problem_title": slug.replace("_", " ").title(), "difficulty": "Easy",
         "readme_description": description, "_readme_examples": {"list": [{"content": "Input: 1\nOutput: 2"}]},
         "readme_constraints": "- 1 <= n <= 10", "readme_additional": "", "solution_class_name": "Solution",
         "_solution_methods": {"list": [{"name": slug, "signature": "(self, n: int) -> int", "body": ""}]}} | extra
    (directory / f"{slug}.json").write_text(json.dumps(p))


# --- normalised keys and the evaluation guard ----------------------------------------------------------------------

def test_normalised_keys_ignore_case_and_whitespace():
    assert sources.text_key("  Hello\n\tWORLD ") == sources.text_key("hello world")
    assert sources.text_key("hello world") != sources.text_key("hello, world")
    assert sources.messages_key(_user("Hi  there")) == sources.text_key("hi there")
    two = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert sources.messages_key(two) != sources.messages_key([{"role": "user", "content": "a b"}])


def test_eval_guard_catches_equal_and_contained_texts():
    long = "Write a persuasive essay to convince your friend to adopt a cat."
    guard = sources.EvalGuard([long, "Is 7 prime?", "   "])
    assert len(guard) == 2
    assert long.upper() in guard
    assert f"Please help.\n\n{long}\n\nThanks!" in guard  # pasted into a longer turn
    assert "is 7   PRIME?" in guard
    assert "Quick question: is 7 prime?" not in guard  # short texts only match whole
    assert "Write a persuasive essay to convince your friend to adopt a dog." not in guard
    statement = "Given an array of integers and a target, return the indices of the two numbers adding up to it."
    guard = sources.EvalGuard([f"# Two Sum\n\n{statement}\n\nInput: 1\n\nShort paragraph."])
    assert f"Can you solve this?\n{statement}" in guard  # one long paragraph of it pasted
    assert "Can you solve this?\nShort paragraph." not in guard


def test_evaluation_texts_hold_both_mt_bench_turns_and_the_code_math_set():
    texts = set(sources.evaluation_texts())
    from hf_jetspec.prompts import mt_bench_prompts

    assert {p.text for turn in (1, 2) for p in mt_bench_prompts(turn)} <= texts
    assert {p.text for p in load_prompts("code-math")} <= texts


# --- sources on small inputs ---------------------------------------------------------------------------------------

def test_sharegpt_open_is_the_generators_prompt_list(tokenizer):
    conversations = [_conversation(str(i), f"question {i}", "answer") for i in range(20)]
    prompts, _ = sources.sharegpt_open(conversations, tokenizer, seed=0)
    expected, _ = data.build_prompts(conversations, tokenizer)
    import random

    random.Random(0).shuffle(expected)
    assert [p["id"] for p in prompts] == [p["id"] for p in expected]
    assert [p["input_ids"] for p in prompts] == [p["input_ids"] for p in expected]
    assert prompts[0]["messages"] == _user(f"question {prompts[0]['id']}")


def test_sharegpt_turns_take_every_later_turn_with_its_history():
    conversations = [_conversation("a", "q1", "r1", "q2", "r2", "q3"),
                     _conversation("c", "continued", "more?", opening="gpt"),
                     _conversation("single", "only")]
    prompts, skipped = sources.sharegpt_turns(conversations, seed=0)
    by_id = {p["id"]: p["messages"] for p in prompts}
    assert sorted(by_id) == ["a#1", "a#2", "c"]
    assert by_id["a#2"] == [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "r1"},
                            {"role": "user", "content": "q2"}, {"role": "assistant", "content": "r2"},
                            {"role": "user", "content": "q3"}]
    assert by_id["c"] == [{"role": "assistant", "content": "continued"}, {"role": "user", "content": "more?"}]
    assert skipped == Counter()
    held = next(f"h{i}" for i in range(1000) if sources.is_held_out(f"h{i}"))
    _, skipped = sources.sharegpt_turns([_conversation(held, "q1", "r1", "q2")])
    assert skipped == {"held_out": 1}


def test_fit_history_drops_the_oldest_turns(tokenizer):
    messages = [{"role": "user", "content": "old " * 100}, {"role": "assistant", "content": "reply " * 100},
                {"role": "user", "content": "recent question"}, {"role": "assistant", "content": "short"},
                {"role": "user", "content": "last"}]
    full = sources.render(tokenizer, messages)
    assert sources.fit_history(tokenizer, messages, max_turn_tokens=50, max_context_tokens=1000) == full
    ids = sources.fit_history(tokenizer, messages, max_turn_tokens=50, max_context_tokens=100)
    assert len(ids) <= 100
    assert ids == sources.render(tokenizer, messages[2:])
    assert sources.fit_history(tokenizer, messages, max_turn_tokens=3, max_context_tokens=1000) is None


def test_leetcode_prompts_hold_back_the_evaluation_split(tmp_path):
    slugs = [f"problem_{i}" for i in range(60)]
    for slug in slugs:
        _problem(tmp_path, slug, f"Description of {slug}.")
    problems = sources.load_leetcode(tmp_path)
    assert [p["slug"] for p in problems] == sorted(slugs)
    assert problems[0]["prompt"].startswith(sources.CODE_INSTRUCTION + "\n\n# Problem 0")
    assert "def problem_0(self, n: int) -> int:" in problems[0]["prompt"]
    prompts, skipped = sources.leetcode_prompts(problems)
    held = sources.eval_problem_slugs(slugs)
    assert len(held) == sources.EVAL_CODE_COUNT and skipped == {"held_out": sources.EVAL_CODE_COUNT}
    assert {p["id"] for p in prompts} == {f"leetcode:{s}" for s in set(slugs) - held}
    assert held == sources.eval_problem_slugs(reversed(slugs))  # a rule on the slugs, not their order


def test_math_questions_come_from_many_modules():
    questions, skipped = sources.math_training_questions(per_module=1)
    modules = {q["id"].split(":")[1] for q in questions}
    assert len(modules) >= 40 and not skipped
    assert any(m.startswith("polynomials__") for m in modules)  # the NumPy 2 patch works
    prompt = sources.math_prompts(questions[:1])[0]
    assert prompt["messages"][0]["content"] == f"{sources.MATH_INSTRUCTION}\n\n{questions[0]['question']}"


class MagpieModel:
    """Stands in for the target: each sample is one of a few scripted user turns, chosen with torch's generator."""

    device = torch.device("cpu")

    def __init__(self, tokenizer):
        eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.generation_config = GenerationConfig(eos_token_id=eos)
        encode = lambda t: tokenizer(t, add_special_tokens=False)["input_ids"]  # noqa: E731
        self.options = [encode("How do I sort a list in Python?") + [eos, eos],
                        encode("Tell me about the history of Rome, briefly.") + [eos, eos],
                        encode("Hi") + [eos, eos, eos],
                        encode("a b c d e f g h i j k l m n o p q r s t")[:10]]
        self.options += [encode(f"Write a poem about the number {i}.") + [eos] for i in range(40)]
        self.width = max(map(len, self.options))

    def generate(self, input_ids, attention_mask, max_new_tokens, pad_token_id, eos_token_id, **kwargs):
        picks = torch.randint(len(self.options), (input_ids.shape[0],)).tolist()
        rows = [self.options[k] + [pad_token_id] * (self.width - len(self.options[k])) for k in picks]
        return torch.cat([input_ids, torch.tensor(rows)[:, :max_new_tokens]], dim=1)


def test_magpie_prompts_are_filtered_and_resumable(tokenizer, tmp_path):
    assert sources.user_prefix(tokenizer).endswith("<|im_start|>user\n")
    model, path = MagpieModel(tokenizer), tmp_path / "magpie.jsonl"
    counts = sources.generate_magpie_prompts(model, tokenizer, path, count=5, batch_size=8, max_new_tokens=16)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert counts["kept"] >= 5 and len(rows) % 8 == 0
    kept = [r["text"] for r in rows if r["reject"] is None]
    assert len(set(map(sources.text_key, kept))) == len(kept)
    assert "Hi" not in kept and all(r["reject"] in (None, "length", "short", "duplicate") for r in rows)
    again = sources.generate_magpie_prompts(model, tokenizer, path, count=counts["kept"] + 1, batch_size=8,
                                            max_new_tokens=16)
    more = [json.loads(line) for line in path.read_text().splitlines()]
    assert more[:len(rows)] == rows and again["kept"] > counts["kept"]
    batches = [int(r["id"].split(":")[1]) for r in more]
    assert batches == sorted(batches) and len(set(batches)) == len(more) // 8
    fresh = tmp_path / "fresh.jsonl"  # batch b is always sampled with the same seed
    sources.generate_magpie_prompts(model, tokenizer, fresh, count=counts["kept"], batch_size=8, max_new_tokens=16)
    assert fresh.read_text() == path.read_text()[:len(fresh.read_text())]
    prompts, rejected = sources.magpie_prompts(path)
    assert [p["messages"][0]["content"] for p in prompts] == [r["text"] for r in more if r["reject"] is None]
    assert sum(rejected.values()) == sum(r["reject"] is not None for r in more)
    assert sources.magpie_prompts(tmp_path / "absent.jsonl") == ([], Counter(no_file=1))


# --- deduplication across sources and against the evaluation sets ---------------------------------------------------

def test_deduplicate_against_evaluation_sets_and_earlier_sources():
    eval_question = "Compute the sum of the first one hundred positive integers, showing your work."
    guard = sources.EvalGuard([eval_question])
    candidates = {
        "sharegpt-open": [{"id": "o1", "messages": _user("Hello there")},
                          {"id": "o2", "messages": _user(eval_question.lower())}],
        "sharegpt-turns": [{"id": "t1", "messages": [*_user(f"Before: {eval_question}"),
                                                     {"role": "assistant", "content": "ok"}, *_user("next")]},
                           {"id": "t2", "messages": [*_user("x"), {"role": "assistant", "content": "y"},
                                                     *_user("z")]},
                           {"id": "t3", "messages": [*_user("X"), {"role": "assistant", "content": "Y "},
                                                     *_user("z")]}],
        "leetcode": [{"id": "leetcode:a", "messages": _user("HELLO  there")}],
        "math": [{"id": "math:m:0", "messages": _user("Solve 2 = x.")}, {"id": "math:m:1",
                                                                      "messages": _user("solve 2 = x.")}],
        "magpie": [{"id": "magpie:0:0", "messages": _user("Solve 2 = x.")}, {"id": "magpie:0:1",
                                                                          "messages": _user("fresh")}],
    }
    skipped = {}
    kept = sources.deduplicate(candidates, guard, skipped)
    assert {name: [p["id"] for p in ps] for name, ps in kept.items()} == {
        "sharegpt-open": ["o1"], "sharegpt-turns": ["t2"], "leetcode": [], "math": ["math:m:0"],
        "magpie": ["magpie:0:1"]}
    assert skipped == {"sharegpt-open": {"eval": 1}, "sharegpt-turns": {"eval": 1, "duplicate_text": 1},
                       "leetcode": {"duplicate_text": 1}, "math": {"duplicate_text": 1},
                       "magpie": {"duplicate_text": 1}}
    assert kept["math"][0]["source"] == "math"


def test_select_prompts_counts_every_source(tokenizer, tmp_path):
    for i in range(30):
        _problem(tmp_path, f"p{i}", f"Solve problem {i}.")
    conversations = [_conversation("a", "Hi", "Hello", "How are you?"), _conversation("b", "Hi")]
    math = [{"id": "math:m:0", "question": "What is 2 + 2?"}]
    selected, counts = sources.select_prompts(
        ["leetcode", "math", "sharegpt-turns", "sharegpt-open"], tokenizer, guard=sources.EvalGuard([]),
        conversations=conversations, problems=sources.load_leetcode(tmp_path), math_questions=math,
        magpie_path=tmp_path / "none.jsonl")
    assert [p["id"] for p in selected["sharegpt-open"]] == ["a"]
    assert counts["sharegpt-open"] == {"duplicate": 1, "candidates": 1, "kept": 1}  # build_prompts' count
    assert [p["id"] for p in selected["sharegpt-turns"]] == ["a#1"]
    assert len(selected["leetcode"]) == 6 and counts["leetcode"] == {"held_out": 24, "candidates": 6, "kept": 6}
    assert selected["math"][0]["input_ids"] == sources.render(tokenizer, _user(sources.math_prompt("What is 2 + 2?")))
    assert counts["magpie"] == {"no_file": 1, "candidates": 0}
    assert all(p["source"] == name for name, ps in selected.items() for p in ps)
    with pytest.raises(ValueError, match="unknown sources"):
        sources.select_prompts(["nope"], tokenizer)


# --- the committed code/math evaluation set -------------------------------------------------------------------------

def test_code_math_eval_set_is_committed_and_loadable():
    rows = [json.loads(line) for line in CODE_MATH_EVAL.read_text().splitlines()]
    assert Counter(r["category"] for r in rows) == {"code": 24, "math": 24}
    assert len({r["id"] for r in rows}) == 48 and all(r["prompt"].strip() for r in rows)
    prompts = load_prompts("code-math")
    assert [(p.id, p.category, p.text) for p in prompts] == [(r["id"], r["category"], r["prompt"]) for r in rows]
    problems = sources.load_leetcode()
    held = sources.eval_problem_slugs(p["slug"] for p in problems)
    by_slug = {p["slug"]: p for p in problems}
    code = [r for r in rows if r["category"] == "code"]
    assert {r["id"] for r in code} == {f"leetcode:{s}" for s in held}
    assert all(r["prompt"] == by_slug[r["id"].split(":", 1)[1]]["prompt"] for r in code)  # reproducible
    assert all(r["id"].startswith("math:") and r["prompt"] == sources.math_prompt(r["question"])
               for r in rows if r["category"] == "math")


def test_eval_set_never_overlaps_training_prompts():
    """No training prompt of the code and math sources (the packaged problems, the committed math questions) holds
    an evaluation text, and the sources never yield an evaluation problem."""
    guard = sources.EvalGuard(sources.evaluation_texts())
    math, _ = sources.load_math_questions(sources.MATH_FILE) if sources.MATH_FILE.exists() else ([], None)
    candidates = {"leetcode": sources.leetcode_prompts(sources.load_leetcode())[0], "math": sources.math_prompts(math)}
    skipped = {}
    kept = sources.deduplicate(candidates, guard, skipped)
    eval_ids = {p.id for p in load_prompts("code-math")}
    assert not {p["id"] for ps in kept.values() for p in ps} & eval_ids
    assert not any(m["content"] in guard for ps in kept.values() for p in ps for m in p["messages"])
    assert skipped["leetcode"]["eval"] <= 2  # problems sharing a paragraph with an evaluation problem
    assert len(kept["leetcode"]) == 1405 - 24 - skipped["leetcode"]["duplicate_text"] - skipped["leetcode"]["eval"]


# --- the answer store -----------------------------------------------------------------------------------------------

def _rows(prefix, n, start=0):
    return [{"id": f"{prefix}{i}", "input_ids": list(range(i + 2)) + [49151] * (i % 3), "prompt_len": 2,
             "finish": ("eos", "length")[i % 2]} for i in range(start, start + n)]


def test_chunk_round_trip(tmp_path):
    rows = _rows("r", 5)
    path = answers.write_chunk(tmp_path / "chunk-00000.safetensors", rows, "demo")
    assert answers.read_chunk(path) == ("demo", rows)
    assert not list(tmp_path.glob(".*"))  # the temporary file was renamed into place
    from safetensors.numpy import load_file

    assert load_file(str(path))["tokens"].dtype == np.uint16
    wide = [{"id": "w", "input_ids": [70000, 1], "prompt_len": 1, "finish": "eos"}]
    assert answers.read_chunk(answers.write_chunk(tmp_path / "chunk-00001.safetensors", wide, "x"))[1] == wide
    assert load_file(str(tmp_path / "chunk-00001.safetensors"))["tokens"].dtype == np.int32


def test_store_resumes_and_reads_back(tmp_path):
    settings = {"model": "m", "dtype": "bf16", "max_new_tokens": 4, "temperature": 0.0}
    store = answers.AnswerStore(tmp_path, "src", settings=settings, chunk_rows=4)
    store.add([])
    store.flush()
    assert not (tmp_path / "src").exists()  # the folder and its meta.json come with the first row
    store.add(_rows("a", 3))
    assert json.loads((tmp_path / "src" / answers.META).read_text())["settings"] == settings
    assert answers.chunk_paths(tmp_path / "src") == []
    store.add(_rows("a", 3, start=3))  # 6 rows: one chunk of 4, 2 pending
    assert [p.name for p in answers.chunk_paths(tmp_path / "src")] == ["chunk-00000.safetensors"]
    with open(tmp_path / "src" / answers.PENDING, "a") as f:
        f.write('{"id": "a9", "input_')  # an interrupted pending write
    reopened = answers.AnswerStore(tmp_path, "src", settings=settings, chunk_rows=4)
    assert reopened.done == {f"a{i}" for i in range(6)} and len(reopened.pending) == 2
    reopened.add(_rows("a", 3, start=6))  # 2 pending + 3: a chunk of 4, then 1 pending
    reopened.flush()  # the last row as a chunk of its own
    assert len(answers.chunk_paths(tmp_path / "src")) == 3 and reopened.pending == []
    rows = list(answers.read_answers(tmp_path))
    assert rows == _rows("a", 9)
    # the second chunk was appended to a source holding one: evaluation draws from the first 4 rows only
    assert json.loads((tmp_path / "src" / answers.META).read_text())[answers.EVAL_POOL] == 4
    marked = [r if i < 4 else {**r, "eval_candidate": False} for i, r in enumerate(rows)]
    assert read_rows(tmp_path) == marked == read_rows(tmp_path / "src")
    sequences = list(answers.token_sequences(tmp_path, answers_only=True))
    assert [s.tolist() for s in sequences] == [r["input_ids"][2:] for r in rows]
    summary = answers.store_summary(tmp_path)["src"]
    assert summary["rows"] == 9 and summary["chunks"] == 3 and summary["eos"] == 5
    with pytest.raises(ValueError, match="other settings"):
        answers.AnswerStore(tmp_path, "src", settings=settings | {"dtype": "fp32"})


def test_appending_answers_keeps_the_evaluation_split(tmp_path):
    """The trainer draws evaluation rows from a shuffle of its first data source: answers appended to that source
    later (a generator run in the next session) must not reshuffle it, or rows a head trained on would become its
    evaluation rows. Splits made before and after an append agree, and every appended row is trained on."""
    from hf_jetspec.training.features import split_rows

    def _rows(prefix, n):  # ids the benchmark's held-out filter keeps
        names = [f"{prefix}{i}" for i in range(10 * n) if not sources.is_held_out(f"{prefix}{i}")][:n]
        return [{"id": name, "input_ids": [1, i, i], "prompt_len": 2, "finish": "eos"} for i, name in enumerate(names)]

    settings = {"model": "m", "dtype": "bf16", "max_new_tokens": 4, "temperature": 0.0}
    store = answers.AnswerStore(tmp_path, "src", settings=settings, chunk_rows=10)
    store.add(_rows("a", 30))  # three chunks in one session: the pool is pinned before the second
    assert answers.eval_pool(tmp_path / "src") == 10
    meta = tmp_path / "src" / answers.META
    meta.write_text(json.dumps({k: v for k, v in json.loads(meta.read_text()).items() if k != answers.EVAL_POOL}))
    assert answers.eval_pool(tmp_path / "src") is None  # a store from before pinning: every row is a candidate
    for seed in range(5):
        for first in ([tmp_path / "src"], [tmp_path]):
            before_train, before_eval = split_rows([read_rows(p) for p in first], 6, seed)
            assert len(before_eval) == 6 and len(before_train) == 24
        reopened = answers.AnswerStore(tmp_path, "src", settings=settings, chunk_rows=10)
        reopened.add(_rows(f"b{seed}-", 20))  # pins the pool at the rows held now
        for first in ([tmp_path / "src"], [tmp_path]):
            train, evaluation = split_rows([read_rows(p) for p in first], 6, seed)
            assert [r["id"] for r in evaluation] == [r["id"] for r in before_eval]
            assert {r["id"] for r in train} == {r["id"] for r in before_train} | {r["id"] for r in _rows(f"b{seed}-", 20)}
        assert answers.eval_pool(tmp_path / "src") == 30
        for path in answers.chunk_paths(tmp_path / "src")[3:]:
            path.unlink()
    # without the pin the appended rows would have reshuffled the evaluation set
    meta.write_text(json.dumps({k: v for k, v in json.loads(meta.read_text()).items() if k != answers.EVAL_POOL}))
    answers.AnswerStore(tmp_path, "src", chunk_rows=10)  # reopening alone pins nothing
    answers.write_chunk(tmp_path / "src" / "chunk-00003.safetensors", _rows("c", 10), "src")  # not via the store
    assert [r["id"] for r in split_rows([read_rows(tmp_path / "src")], 6, 0)[1]] != \
        [r["id"] for r in split_rows([list(answers.read_answers(tmp_path))[:30]], 6, 0)[1]]


def test_store_summary_table_and_flush(tmp_path, capsys):
    answers.AnswerStore(tmp_path, "src", chunk_rows=2).add(_rows("a", 5))
    answers.main([str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("| src | 2 | 4 | 2 | 8 |") and lines[3].startswith("| total | 2 | 4 |")
    answers.main([str(tmp_path), "--flush"])  # the pending fifth row becomes a chunk
    assert capsys.readouterr().out.splitlines()[2].startswith("| src | 3 | 5 | 3 | 10 |")
    assert (tmp_path / "src" / answers.PENDING).read_text() == ""
    (tmp_path / "notes.txt").write_text("mine")
    for argv, message in (([str(tmp_path / "nowhere")], "no answer store there"),  # was an empty table
                          ([str(tmp_path), "--datastore", str(tmp_path / "notes.txt")], "a file; it names the folder")):
        with pytest.raises(SystemExit):  # the second was a FileExistsError traceback
            answers.main(argv)
        assert message in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_torn_chunk_is_skipped_by_readers_and_regenerated_by_writers(tmp_path):
    directory = tmp_path / "src"
    directory.mkdir()
    answers.write_chunk(directory / "chunk-00000.safetensors", _rows("a", 3), "src")
    whole = answers.write_chunk(directory / "chunk-00001.safetensors", _rows("b", 3), "src").read_bytes()
    (directory / "chunk-00001.safetensors").write_bytes(whole[: len(whole) // 2])  # cut off
    (directory / ".chunk-00002.safetensors.tmp-123").write_bytes(b"partial")  # never renamed into place
    with pytest.raises(answers.TornChunkError):
        answers.read_chunk(directory / "chunk-00001.safetensors")
    with pytest.warns(UserWarning, match="skipping"):
        assert [r["id"] for r in answers.read_answers(tmp_path)] == ["a0", "a1", "a2"]
    with pytest.warns(UserWarning, match="moving aside"):
        store = answers.AnswerStore(tmp_path, "src", chunk_rows=3)
    assert store.done == {"a0", "a1", "a2"}
    assert (directory / "chunk-00001.safetensors.torn").exists() and not list(directory.glob(".chunk-*"))
    store.add(_rows("b", 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r["id"] for r in answers.read_answers(tmp_path)] == ["a0", "a1", "a2", "b0", "b1", "b2"]
    assert [p.name for p in answers.chunk_paths(directory)] == ["chunk-00000.safetensors", "chunk-00002.safetensors"]


def test_inconsistent_chunk_is_torn(tmp_path):
    from safetensors.numpy import save_file

    path = tmp_path / "chunk-00000.safetensors"
    save_file({"tokens": np.zeros(3, np.uint16), "offsets": np.array([0, 5], np.int64),
               "prompt_len": np.zeros(1, np.int32), "finish": np.zeros(1, np.uint8)}, str(path),
              metadata={"format": answers.FORMAT, "source": "s", "ids": '["x"]'})
    with pytest.raises(answers.TornChunkError, match="inconsistent"):
        answers.read_chunk(path)


def test_selected_prompts_are_cached_until_an_input_changes(tokenizer, tmp_path, monkeypatch):
    for i in range(26):
        _problem(tmp_path, f"p{i}", f"Solve problem {i}.")
    problems = sources.load_leetcode(tmp_path)
    monkeypatch.setattr(sources, "load_leetcode", lambda: problems)
    sharegpt = tmp_path / "sharegpt.json"
    sharegpt.write_text(json.dumps([_conversation("a", "Hi", "Hello", "How are you?")]))
    math = tmp_path / "math.jsonl"
    math.write_text(json.dumps({"id": "math:m:0", "question": "What is 2 + 2?"}) + "\n")
    kwargs = {"cache_dir": tmp_path / "cache", "sharegpt": sharegpt, "math_path": math,
              "magpie_path": tmp_path / "magpie.jsonl", "max_context_tokens": 512}
    names = ["math", "sharegpt-turns", "leetcode"]
    first, counts = sources.cached_select_prompts(names, tokenizer, **kwargs)
    assert len(list((tmp_path / "cache").iterdir())) == 1
    calls, select = [], sources.select_prompts
    monkeypatch.setattr(sources, "select_prompts", lambda *a, **k: calls.append(1) or select(*a, **k))
    again, counts_again = sources.cached_select_prompts(names, tokenizer, **kwargs)
    assert not calls and counts_again == counts
    assert {n: [(p["id"], p["input_ids"]) for p in ps] for n, ps in again.items()} == {
        n: [(p["id"], p["input_ids"]) for p in ps] for n, ps in first.items()}
    math.write_text(json.dumps({"id": "math:m:0", "question": "What is 2 + 3?"}) + "\n")
    sources.cached_select_prompts(names, tokenizer, **kwargs)
    assert calls  # a changed input file is built again
