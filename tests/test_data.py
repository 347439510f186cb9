"""Tests for hf_jetspec.training.data: ShareGPT recovery, prompt building, resumable generation."""

import json

import pytest
import torch
from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

from hf_jetspec.models import convert_gguf, find_smollm2_gguf
from hf_jetspec.training import data

SHAREGPT = """[
  {"id": "a", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]},
  "not a dict",
  {"id": "b"},
  {"id": "c", "conversations": []},
  {"id": "d", "conversations": [{"from": "human", "value": 3}]},
  {"id": "e", "conversations": [{"from": "system", "value": "x"}, {"from": "human", "value": "q"}]},
  {"id": "f", "conversations": [{"from": "human", "value": "q"}, {"from": "human", "value": "q2"}]},
  {"id": "g", "conversations": [{"from": "human", "value": "  \\n"}]},
  {"id": "a", "conversations": [{"from": "human", "value": "same id"}]},
  {"id": "h", "conversations": [{"from": "gpt", "value": "continued"}, {"from": "human", "value": "more?"}]},
  {"id": "i", "conversations": [{"from": "human", "value": "cut off mid-str"""


@pytest.fixture(scope="module")
def tokenizer():
    """SmolLM2's tokenizer (ChatML template, pad == eos)."""
    return AutoTokenizer.from_pretrained(convert_gguf(find_smollm2_gguf()))


@pytest.fixture(scope="module")
def tiny_model(tokenizer):
    """Random 1-layer Llama with SmolLM2's vocabulary."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    return LlamaForCausalLM(config).eval()


class ScriptedModel:
    """Stands in for a causal LM whose ``generate`` appends fixed continuations, padded like transformers does."""

    device = torch.device("cpu")

    def __init__(self, continuations, eos_token_id):
        self.continuations = continuations
        self.generation_config = GenerationConfig(eos_token_id=eos_token_id)

    def generate(self, input_ids, attention_mask, max_new_tokens, pad_token_id, **kwargs):
        self.attention_mask = attention_mask
        width = max(map(len, self.continuations))
        new = [c + [pad_token_id] * (width - len(c)) for c in self.continuations]
        return torch.cat([input_ids, torch.tensor(new)], dim=1)


def _conversation(cid, *humans):
    turns = [t for h in humans for t in ({"from": "human", "value": h}, {"from": "gpt", "value": "ok"})]
    return {"id": cid, "conversations": turns}


@pytest.mark.parametrize("text, expected", [
    ("[1, 2, 3]", ([1, 2, 3], False)),
    (" [ ] ", ([], False)),
    ('[1, 2, {"a": ', ([1, 2], True)),
    ("[1, 2,", ([1, 2], True)),
    ("[1 2]", ([1], True)),
])
def test_decode_json_array_prefix(text, expected):
    assert data.decode_json_array_prefix(text) == expected


def test_load_sharegpt_counts_every_skip_reason(tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(SHAREGPT)
    conversations, skipped = data.load_sharegpt(path)
    assert [c["id"] for c in conversations] == ["a", "h"]
    assert skipped == {"not_a_dict": 1, "no_conversations": 2, "non_string": 1, "wrong_roles": 2,
                       "empty_human": 1, "duplicate_id": 1, "truncated_tail": 1}


def test_build_prompts(tokenizer):
    conversations = [_conversation("a", "Hi", "And then?"), _conversation("dup", "Hi"),
                     _conversation("long", "word " * 200), {"id": "h", "conversations": [
                         {"from": "gpt", "value": "continued"}, {"from": "human", "value": "more?"}]}]
    prompts, skipped = data.build_prompts(conversations, tokenizer, max_prompt_tokens=100)
    expected = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                             tokenize=False)
    assert [p["id"] for p in prompts] == ["a"]
    assert tokenizer.decode(prompts[0]["input_ids"]) == expected
    assert skipped == {"duplicate": 1, "too_long": 1, "not_opening": 1}
    prompts, _ = data.build_prompts(conversations, tokenizer, max_prompt_tokens=100, turns="all")
    assert [p["id"] for p in prompts] == ["a", "a#1", "h"]


@pytest.mark.parametrize("tokens, expected", [
    ([5, 2, 2, 2], ([5, 2], "eos")),
    ([2, 0, 0], ([2], "eos")),
    ([5, 6, 7], ([5, 6, 7], "length")),
])
def test_split_response(tokens, expected):
    assert data.split_response(tokens, {2}) == expected


def test_length_sorted_batches_keep_window_order():
    prompts = [{"id": str(i), "input_ids": [0] * n} for i, n in enumerate([5, 1, 3] * 8 + [2, 1])]
    batches = list(data.length_sorted_batches(prompts, batch_size=3))
    assert [len(b) for b in batches] == [3] * 8 + [2]
    assert [len(p["input_ids"]) for p in batches[0]] == [1] * 3
    assert {p["id"] for b in batches[:8] for p in b} == {str(i) for i in range(24)}


def test_generate_responses_resumes(tokenizer, tiny_model, tmp_path):
    texts = ["Hi", "What is 2+2?", "Name a color.", "Tell me a joke about cats and dogs.", "Why?", "Hello there"]
    prompts, _ = data.build_prompts([_conversation(str(i), t) for i, t in enumerate(texts)], tokenizer)
    out = tmp_path / "gen.jsonl"
    kwargs = {"batch_size": 4, "max_new_tokens": 3}
    assert data.generate_responses(tiny_model, tokenizer, prompts, out, limit=4, **kwargs) == 4
    first_rows = out.read_text()
    with open(out, "a") as f:
        f.write('{"id": "torn')  # an interrupted write
    assert data.generate_responses(tiny_model, tokenizer, prompts, out, **kwargs) == 2
    assert data.generate_responses(tiny_model, tokenizer, prompts, out, **kwargs) == 0
    assert out.read_text().startswith(first_rows)
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(rows) == sorted(p["id"] for p in prompts)
    for prompt in prompts:
        row = rows[prompt["id"]]
        response = row["input_ids"][row["prompt_len"]:]
        assert row["input_ids"][:row["prompt_len"]] == prompt["input_ids"]
        assert tokenizer.eos_token_id not in response[:-1]
        assert (response[-1] == tokenizer.eos_token_id) == (row["finish"] == "eos")
        assert row["finish"] == "eos" or len(response) == 3


def test_generate_batch_left_pads_and_strips_padding(tokenizer):
    eos = tokenizer.eos_token_id
    batch = [{"id": "short", "input_ids": [7, 8]}, {"id": "long", "input_ids": [7, 8, 9, 10]}]
    model = ScriptedModel([[5, eos], [6, 6, 6]], eos)
    rows, states = data.generate_batch(model, tokenizer, batch, max_new_tokens=3, temperature=0.0)
    assert states is None
    assert model.attention_mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    assert rows == [{"id": "short", "input_ids": [7, 8, 5, eos], "prompt_len": 2, "finish": "eos"},
                    {"id": "long", "input_ids": [7, 8, 9, 10, 6, 6, 6], "prompt_len": 4, "finish": "length"}]


def test_main_end_to_end(tmp_path, capsys):
    sharegpt = tmp_path / "sharegpt.json"
    sharegpt.write_text(SHAREGPT)
    out = tmp_path / "gen.jsonl"
    data.main(["--sharegpt", str(sharegpt), "--out", str(out), "--max-new-tokens", "2"])
    assert "'truncated_tail': 1" in capsys.readouterr().out
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["a"]


def test_states_recorded_during_generation_equal_a_teacher_forced_pass(tmp_path, tokenizer):
    """The states saved while generating (left-padded batch, one token per step) are what a separate
    teacher-forced target pass would give, and the shards load as a FeatureStore."""
    from hf_jetspec.training.features import FeatureStore, target_states

    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=2, num_key_value_heads=1, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, initializer_range=0.2)
    model = LlamaForCausalLM(config).eval()
    prompts = [{"id": "p1", "input_ids": [7, 8, 9]}, {"id": "p2", "input_ids": [20, 21, 22, 23, 24, 25]}]
    out, states = tmp_path / "gen.jsonl", tmp_path / "states"
    data.generate_responses(model, tokenizer, prompts, out, batch_size=2, max_new_tokens=6, states_dir=states,
                            layer_ids=[0, 2])
    store = FeatureStore(states)
    assert len(store) == 2 and store.layer_ids == [0, 2]
    rows = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    for i in range(2):
        item = store[i]
        row = rows[store.items[i][1]["id"]]
        assert item["input_ids"].tolist() == row["input_ids"]
        features, final = target_states(model, torch.tensor([row["input_ids"]]), None, [0, 2])
        n = len(row["input_ids"]) - 1  # the last token was never fed to the model
        assert torch.allclose(item["features"][:n].float(), features[0, :n], atol=3e-2, rtol=3e-2)
        assert torch.allclose(item["final"][:n].float(), final[0, :n], atol=3e-2, rtol=3e-2)


def _qa(cid, question, answer, opening="human"):
    turns = [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]
    return {"id": cid, "conversations": turns if opening == "human" else turns[::-1]}


def test_answer_rows_are_the_conversations_own_answers(tokenizer):
    from hf_jetspec.prompts import is_held_out

    held = next(f"h{i}" for i in range(1000) if is_held_out(f"h{i}"))
    conversations = [
        _qa("ok", "What is 2+2?", "It is four: two plus two."),
        _qa("long", "Count.", " ".join(str(i) for i in range(60))),
        _qa(held, "Q?", "A long enough answer here."),
        _qa("skip", "Q?", "A long enough answer here."),
        {"id": "lone", "conversations": [{"from": "human", "value": "q"}]},
        _qa("opens", "Q?", "A long enough answer here.", opening="gpt"),
        _qa("blank", "Q?", "  \n"),
        _qa("short", "Q?", "Yes"),
        _qa("big", "word " * 200, "A long enough answer here."),
    ]
    rows, skipped = data.answer_rows(conversations, tokenizer, max_prompt_tokens=64, max_answer_tokens=24,
                                     exclude={"skip"})
    assert [r["id"] for r in rows] == ["orig:ok", "orig:long"]
    assert skipped == {"held_out": 1, "excluded": 1, "not_opening": 2, "empty_answer": 1, "short_answer": 1,
                       "too_long": 1}
    ok, long = rows
    messages = [{"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": "It is four: two plus two."}]
    full = tokenizer(tokenizer.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]
    prompt = tokenizer(tokenizer.apply_chat_template(messages[:1], add_generation_prompt=True, tokenize=False),
                       add_special_tokens=False)["input_ids"]
    assert ok["input_ids"] == full and ok["prompt_len"] == len(prompt) and ok["finish"] == "eos"
    assert tokenizer.eos_token_id in ok["input_ids"][ok["prompt_len"]:]
    assert len(long["input_ids"]) == long["prompt_len"] + 24 and long["finish"] == "length"


def test_main_dataset_answers_with_states(tmp_path, tokenizer):
    """`--responses dataset`: rows of the conversations' own answers, resumable, plus a teacher-forced feature
    store of exactly those rows; `--exclude-eval` leaves out the trainer's evaluation conversations."""
    from hf_jetspec.training.features import FeatureStore, split_rows

    conversations = [_qa(f"c{i}", f"Question {i}?", f"Answer number {i} is a fine answer.") for i in range(12)]
    sharegpt = tmp_path / "sharegpt.json"
    sharegpt.write_text(json.dumps(conversations))
    first = tmp_path / "first.jsonl"  # the trainer's first --data file: same conversations, target-answered
    first.write_text("".join(json.dumps({"id": f"c{i}", "input_ids": [1, 2, 3], "prompt_len": 1}) + "\n"
                             for i in range(12)))
    evaluation = {r["id"] for r in split_rows([data.read_jsonl(first)], 8, 0)[1]}
    out, states = tmp_path / "orig.jsonl", tmp_path / "states"
    argv = ["--sharegpt", str(sharegpt), "--out", str(out), "--responses", "dataset", "--exclude-eval", str(first),
            "--states-dir", str(states), "--tap-layers", "1,5", "--limit", "3"]
    data.main(argv)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and not {r["id"].removeprefix("orig:") for r in rows} & evaluation
    store = FeatureStore(states)
    assert store.layer_ids == [1, 5]
    stored = {e["id"]: store[i]["input_ids"].tolist() for i, (_, e) in enumerate(store.items)}
    assert stored == {r["id"]: r["input_ids"] for r in rows}
    data.main(argv)  # resumed: nothing added
    assert len(out.read_text().splitlines()) == 3


def test_generate_to_stores_interleaves_sources_and_resumes(tokenizer, tiny_model, tmp_path, monkeypatch):
    from hf_jetspec.training.answers import AnswerStore, chunk_paths, read_answers

    prompts = {name: data.build_prompts([_conversation(f"{name}{i}", f"{name} question {i}") for i in range(n)],
                                        tokenizer)[0] for name, n in (("x", 5), ("y", 2))}
    order, generate_batch = [], data.generate_batch
    monkeypatch.setattr(data, "generate_batch",
                        lambda model, tok, batch, **kw: order.append(batch[0]["id"][0]) or generate_batch(
                            model, tok, batch, **kw))
    stores = {name: AnswerStore(tmp_path, name, chunk_rows=2) for name in prompts}
    kwargs = {"batch_size": 2, "max_new_tokens": 3}
    assert data.generate_to_stores(tiny_model, tokenizer, prompts, stores, limit=3, **kwargs) == 5
    assert order == ["x", "y", "x"]  # one batch of each source in turn
    stores = {name: AnswerStore(tmp_path, name, chunk_rows=2) for name in prompts}
    assert data.generate_to_stores(tiny_model, tokenizer, prompts, stores, **kwargs) == 2
    assert data.generate_to_stores(tiny_model, tokenizer, prompts, stores, **kwargs) == 0
    rows = {r["id"]: r for r in read_answers(tmp_path)}
    assert sorted(rows) == sorted(p["id"] for ps in prompts.values() for p in ps)
    assert [len(chunk_paths(tmp_path / name)) for name in prompts] == [3, 1]
    for prompt in prompts["x"]:
        assert rows[prompt["id"]]["input_ids"][: rows[prompt["id"]]["prompt_len"]] == prompt["input_ids"]


def test_main_store_end_to_end(tmp_path, capsys):
    from hf_jetspec.training.answers import AnswerStore, main as answers_main
    from hf_jetspec.training.features import read_rows

    sharegpt = tmp_path / "sharegpt.json"
    sharegpt.write_text(SHAREGPT)
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "math.jsonl").write_text(json.dumps({"id": "math:m:0", "question": "What is 2+2?"}) + "\n")
    store = tmp_path / "answers"
    argv = ["--sharegpt", str(sharegpt), "--store", str(store), "--source", "sharegpt-open,math,leetcode",
            "--prompts-dir", str(tmp_path / "prompts"), "--max-new-tokens", "2", "--limit", "1", "--dtype", "bf16"]
    data.main(argv)
    out = capsys.readouterr().out
    assert "math: {" in out and "'kept': 1" in out and "wrote 3 rows" in out
    rows = read_rows(store)
    assert {r["id"].split(":")[0] for r in rows} == {"a", "leetcode", "math"}
    assert json.loads((store / "math" / "meta.json").read_text())["settings"]["dtype"] == "bf16"
    data.main(argv)
    assert "wrote 0 rows" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        data.parse_args(["--store", str(store), "--out", str(tmp_path / "x.jsonl")])
    # float32 answers (6x faster than bf16 on a CPU without native bf16) go to <source>-fp32 folders and answer
    # only the prompts no folder of their source holds; the bf16 folders refuse them
    with pytest.raises(ValueError, match="other settings"):
        data.main([*argv[:-2], "--dtype", "fp32"])
    fp32 = [*argv[:-4], "--limit", "2", "--dtype", "fp32", "--store-suffix", "fp32"]
    data.main(fp32)
    out = capsys.readouterr().out
    assert "leetcode: 1 prompts answered in other folders" in out  # the fixture's other sources hold one prompt
    assert "wrote 1 rows" in out
    meta = json.loads((store / "leetcode-fp32" / "meta.json").read_text())
    assert meta["source"] == "leetcode" and meta["settings"]["dtype"] == "fp32"
    ids = [r["id"] for r in read_rows(store)]
    assert len(ids) == len(set(ids)) == 4
    assert not (store / "math-fp32").exists()  # its one prompt is answered in math/: no empty folder is left
    data.main(fp32)
    assert "wrote 0 rows" in capsys.readouterr().out
    answers_main([str(store), "--flush"])  # every folder, each under its own source
    assert "| leetcode-fp32 | 1 | 1 |" in capsys.readouterr().out
    with pytest.raises(ValueError, match="holds answers of source 'leetcode', not 'math'"):
        AnswerStore(store, "math", folder="leetcode-fp32")


@pytest.mark.parametrize("suffix, message", [("", "--store-suffix must be letters"), ("../x", "must be letters"),
                                             ("fp32", "--store-suffix names a folder of --store")])
def test_store_suffix_is_a_folder_name_part(suffix, message, tmp_path, capsys):
    store = ["--store", str(tmp_path / "answers")] if suffix != "fp32" else ["--out", str(tmp_path / "x.jsonl")]
    with pytest.raises(SystemExit) as stop:
        data.parse_args([*store, "--store-suffix", suffix])
    assert stop.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("option, message", [
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),  # was "range() arg 3 must not be zero"
    (["--chunk-rows", "0"], "--chunk-rows must be >= 1"),  # was a traceback from the store
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["--max-context-tokens", "-1"], "--max-context-tokens must be >= 1"),
    (["--max-prompt-tokens", "0"], "--max-prompt-tokens must be >= 1"),
    (["--threads", "0"], "--threads must be >= 1"),  # ran with torch's default threads
    (["--limit", "-1"], "--limit must be >= 0, got -1"),  # sliced the last prompt off and answered the rest
    (["--temperature", "-0.5"], "--temperature must be >= 0"),
    (["--temperature", "nan"], "--temperature must be >= 0, got nan"),
])
def test_generator_numbers_out_of_range_are_named(option, message, tmp_path, capsys):
    """The answer generator's counts are checked before a model loads or a store folder is made."""
    with pytest.raises(SystemExit) as stop:
        data.parse_args(["--store", str(tmp_path / "answers"), "--source", "math", *option])
    assert stop.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "answers").exists()
    assert data.parse_args(["--store", "s", "--limit", "0", "--threads", "2"]).limit == 0


def test_datastore_and_calibration_prompts_from_a_store(tmp_path, tokenizer):
    """The store's answers become a datastore (answers only, the tokenizer's fingerprint); calibration prompts are
    single-turn rows whose text renders back to the stored prompt, and their answers are left out of the
    calibration datastore."""
    from hf_jetspec.suffix_index import CorpusIndex, tokenizer_fingerprint
    from hf_jetspec.training.answers import AnswerStore, build_datastore
    from hf_jetspec.training.calibrate import held_out_rows, main as calibrate_main
    from hf_jetspec.prompts import encode_prompt

    store = AnswerStore(tmp_path / "answers", "demo", chunk_rows=2)
    rows = []
    for number in range(5):
        messages = [{"role": "user", "content": f"Question {number}: what is {number} + {number}?"}]
        if number == 4:  # a later turn: two user turns, never a calibration prompt
            messages = [messages[0], {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                               return_dict=True)["input_ids"]
        answer = tokenizer(f"The answer is {2 * number}, number {number}.")["input_ids"]
        rows.append({"id": f"demo:{number}", "input_ids": list(prompt) + answer, "prompt_len": len(prompt),
                     "finish": "eos"})
    store.add(rows)
    store.flush()

    index = CorpusIndex.load(build_datastore(tmp_path / "answers", tmp_path / "ds", tokenizer))
    assert index.tokenizer_fingerprint == tokenizer_fingerprint(tokenizer)
    assert index.tokens.size == sum(len(r["input_ids"]) - r["prompt_len"] + 1 for r in rows)  # + 1 separator each

    held = held_out_rows(tmp_path / "answers", tokenizer, per_source=10)
    assert sorted(r["id"] for r in held) == [f"demo:{n}" for n in range(4)]
    for row in held:
        stored = next(r for r in rows if r["id"] == row["id"])
        assert encode_prompt(tokenizer, row["prompt"])[0].tolist() == stored["input_ids"][: stored["prompt_len"]]

    calibrate_main([str(tmp_path / "answers"), "--per-source", "2", "--seed", "1", "--out", str(tmp_path / "cal")])
    chosen = [json.loads(line)["id"] for line in (tmp_path / "cal" / "prompts.jsonl").read_text().splitlines()]
    left = CorpusIndex.load(tmp_path / "cal")
    kept = [r for r in rows if r["id"] not in chosen]
    assert len(chosen) == 2 and left.tokens.size == sum(len(r["input_ids"]) - r["prompt_len"] + 1 for r in kept)
