"""Train a JetSpec head with the transformers ``Trainer`` (so ``accelerate launch`` scales it to many GPUs).

The head is ``Trainer.model`` (checkpoints hold only the head); the frozen target stays outside its module tree,
on the trainer. Evaluation is the real decoding loop: tau (tokens per target forward) of greedy JetSpec decoding
on held-out prompts.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import EarlyStoppingCallback, Trainer, TrainingArguments

from hf_jetspec.decoding.jetspec import jetspec_generate
from hf_jetspec.files import json_field, refuse_foreign_files
from hf_jetspec.head import JetSpecHead

from .argcheck import require_at_least
from .data import eos_token_ids
from .features import (FeatureStore, cap_prompts, check_teacher, read_rows, split_rows, target_states,
                       teacher_transform)
from .init import init_from_target
from .loss import jetspec_loss, logits_projection, sample_anchors
from .vocab import frequent_tokens


class SequenceDataset(Dataset):
    """Rows ``{"input_ids", "prompt_len"}`` (online mode: the target runs inside the training step)."""

    def __init__(self, rows: list[dict], max_length: int | None = None) -> None:
        self.rows = [r for r in rows if len(r["input_ids"]) > r["prompt_len"]]
        self.max_length = max_length

    def __len__(self) -> int:
        return len(self.rows)

    def ids(self) -> set[str]:
        return {str(r.get("id")) for r in self.rows}

    def __getitem__(self, i: int) -> dict:
        row = self.rows[i]
        ids = row["input_ids"][: self.max_length] if self.max_length else row["input_ids"]
        return {"input_ids": torch.tensor(ids), "prompt_len": row["prompt_len"], "index": i}


class StoreDataset(Dataset):
    """Sequences with precomputed target states (a `FeatureStore`), optionally without the ids in ``exclude``."""

    def __init__(self, store: FeatureStore, exclude: set[str] = frozenset()) -> None:
        self.store = store
        self.indices = [i for i, (_, entry) in enumerate(store.items)
                        if str(entry["id"]) not in exclude and entry["length"] > entry["prompt_len"]]

    def __len__(self) -> int:
        return len(self.indices)

    def ids(self) -> set[str]:
        return {str(self.store.items[i][1]["id"]) for i in self.indices}

    def __getitem__(self, i: int) -> dict:
        return {**self.store[self.indices[i]], "index": i}


@dataclass
class AnchorCollator:
    """Pads a batch (right padding) and draws ``num_anchors`` random anchors per sequence in its response part.

    Anchors are fresh every time a sequence comes round (every epoch); ``fixed_anchors`` draws each sequence's from
    a generator seeded by its dataset index instead, so every epoch trains the same anchors (an ablation)."""

    num_anchors: int = 16
    seed: int | None = None
    fixed_anchors: bool = False

    def __post_init__(self) -> None:
        self.generator = torch.Generator().manual_seed(self.seed) if self.seed is not None else None

    def __call__(self, items: list[dict]) -> dict:
        lengths = torch.tensor([len(x["input_ids"]) for x in items])
        width = int(lengths.max())
        batch = {
            "input_ids": torch.stack([F.pad(x["input_ids"], (0, width - len(x["input_ids"]))) for x in items]),
            "lengths": lengths,
        }
        batch["attention_mask"] = (torch.arange(width)[None] < lengths[:, None]).long()
        starts = torch.tensor([max(0, x["prompt_len"] - 1) for x in items])
        if self.fixed_anchors:
            batch["anchors"] = torch.cat([
                sample_anchors(lengths[i : i + 1], starts[i : i + 1], self.num_anchors,
                               torch.Generator().manual_seed((self.seed or 0) * 1_000_003 + int(x["index"])))
                for i, x in enumerate(items)])
        else:
            batch["anchors"] = sample_anchors(lengths, starts, self.num_anchors, self.generator)
        for key in ("features", "final"):
            if key in items[0]:
                batch[key] = torch.stack([F.pad(x[key], (0, 0, 0, width - x[key].shape[0])) for x in items])
        return batch


MIN_REFERENCE_SKILL = 0.02  # chain tau above 1 a reference head needs on the held-out rows to scale by


def memorisation(held: float, trained: float, reference_held: float, reference_trained: float) -> float:
    """How much more a head accepts on rows it trained on than their composition explains: its trained chain tau
    minus ``1 + (held - 1) * (reference_trained - 1) / (reference_held - 1)``, the held-out skill scaled by how much
    easier the reference head (which saw neither set) finds the trained rows. Two 64-row samples of one source
    differ by up to ~0.3 chain tau from composition alone; the scaling, not a difference of gaps, keeps a weak head
    (chain tau near 1 everywhere) from reading as negative memorisation."""
    return trained - (1.0 + (held - 1.0) * (reference_trained - 1.0) / (reference_held - 1.0))


class JetSpecTrainer(Trainer):
    """``Trainer`` whose model is the head; ``target`` (frozen) provides features, embeddings, LM head, teacher.
    Its ``eval_dataset`` is a list of held-out prompts (token id lists), evaluated by decoding."""

    def __init__(self, *args, target, kd_temperature: float = 1.0, depth_decay: float | None = None,
                 eval_max_new_tokens: int = 64, logits_dtype: torch.dtype | None = None,
                 sample_slots: bool = False, feature_noise: float = 0.0, acceptance_weight: float = 0.0,
                 eval_sequences: list[dict] | None = None, train_sequences: list[dict] | None = None,
                 eval_anchor_stride: int = 4, reference_head: JetSpecHead | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.eval_anchor_stride = eval_anchor_stride
        self.train_sequences = train_sequences or []
        self.reference_taus = None
        self.feature_noise = feature_noise
        self.acceptance_weight = acceptance_weight
        self.eval_sequences = eval_sequences or []
        self.logits_dtype = logits_dtype
        self.sample_slots = sample_slots
        self.target = target.eval().requires_grad_(False)
        self.teacher_transform = teacher_transform(self.target)
        check_teacher(self.target, self.teacher_transform)
        self.kd_temperature = kd_temperature
        self.depth_decay = depth_decay
        self.eval_max_new_tokens = eval_max_new_tokens
        if reference_head is not None:  # before training: a reference that cannot measure fails at once
            self.reference_taus = self._reference_taus(reference_head.eval().requires_grad_(False))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        head = model.module if hasattr(model, "module") else model
        device = inputs["input_ids"].device
        if self.target.device != device:
            self.target.to(device)
        if "features" in inputs:
            features, final = inputs["features"], inputs["final"]
        else:
            features, final = target_states(self.target, inputs["input_ids"], inputs["attention_mask"],
                                            head.config.target_layer_ids)
        if self.feature_noise and model.training:  # EAGLE: U(-a, a) on the target features the head reads
            features = features.float() + torch.empty(features.shape, device=device).uniform_(
                -self.feature_noise, self.feature_noise)
        lm_head = self.target.get_output_embeddings()
        project = logits_projection(lm_head, self.logits_dtype)

        def teacher(batch_index, positions):
            return self.teacher_transform(project(final[batch_index, positions]))

        loss = jetspec_loss(head, features, inputs["input_ids"], inputs["lengths"], inputs["anchors"], teacher,
                            self.target.get_input_embeddings(), lm_head, self.kd_temperature, self.depth_decay,
                            logits_dtype=self.logits_dtype, sample_slots=self.sample_slots,
                            acceptance_weight=self.acceptance_weight)
        return (loss, {}) if return_outputs else loss

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict:
        """Tau of the real greedy JetSpec loop on the held-out prompts (``eval_tau``) and, given held-out
        sequences, their teacher-forced chain tau (``eval_chain_tau``: `diagnose.depth_accuracy` with an anchor at
        every ``eval_anchor_stride``-th position, the target's states computed once; deterministic and cheap, what
        early stopping watches). Given ``train_sequences`` (rows it trains on), also their chain tau
        (``eval_train_chain_tau``) and the gap, trained minus held-out (``eval_chain_tau_gap``); with a
        ``reference_head``, ``eval_memorisation`` (see `memorisation`)."""
        from .diagnose import depth_accuracy

        head = self.head
        prompts = eval_dataset if eval_dataset is not None else self.eval_dataset
        metrics = {}
        if prompts:
            metrics[f"{metric_key_prefix}_tau"] = measure_tau(self.target, head, prompts, self.eval_max_new_tokens)
        was_training = head.training
        head.eval()
        for name, attr in (("chain_tau", "eval_sequences"), ("train_chain_tau", "train_sequences")):
            if getattr(self, attr):
                metrics[f"{metric_key_prefix}_{name}"] = depth_accuracy(
                    head, self.target, self._with_states(attr), self.eval_anchor_stride)["chain_tau"]
        head.train(was_training)
        held = metrics.get(f"{metric_key_prefix}_chain_tau")
        trained = metrics.get(f"{metric_key_prefix}_train_chain_tau")
        if held is not None and trained is not None:
            metrics[f"{metric_key_prefix}_chain_tau_gap"] = trained - held
            if self.reference_taus is not None:
                metrics[f"{metric_key_prefix}_reference_chain_tau"] = self.reference_taus[0]
                metrics[f"{metric_key_prefix}_reference_train_chain_tau"] = self.reference_taus[1]
                metrics[f"{metric_key_prefix}_memorisation"] = memorisation(held, trained, *self.reference_taus)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    @property
    def head(self) -> JetSpecHead:
        """The head being trained (unwrapped from a distributed wrapper)."""
        return self.model.module if hasattr(self.model, "module") else self.model

    def _with_states(self, attr: str) -> list[dict]:
        """The ``attr`` sequences with the target's states for the head's taps (computed once, kept)."""
        from .diagnose import with_target_states

        sequences = getattr(self, attr)
        if sequences and "features" not in sequences[0]:
            sequences = with_target_states(self.target, sequences, self.head.config.target_layer_ids)
            setattr(self, attr, sequences)
        return sequences

    def _reference_taus(self, reference: JetSpecHead) -> tuple[float, float]:
        """(held-out, trained) chain tau of ``reference`` (the target's states reused where it taps the same
        layers as the head)."""
        from .diagnose import depth_accuracy

        self.target.to(self.args.device)  # before training the target may still be on the CPU
        reference = reference.to(self.args.device)
        taus = []
        for attr in ("eval_sequences", "train_sequences"):
            sequences = self._with_states(attr)
            if reference.config.target_layer_ids != self.head.config.target_layer_ids:
                sequences = [{k: v for k, v in row.items() if k not in ("features", "final")} for row in sequences]
            taus.append(depth_accuracy(reference, self.target, sequences, self.eval_anchor_stride)["chain_tau"])
        if taus[0] - 1.0 < MIN_REFERENCE_SKILL:
            raise ValueError(f"the reference head's chain tau on the held-out rows is {taus[0]:.3f}: it accepts "
                             "too little to measure the rows' composition; give a trained head")
        return taus[0], taus[1]

    def prediction_step(self, *args, **kwargs):
        raise NotImplementedError("JetSpec heads are evaluated by decoding (evaluate()), not by prediction.")


@torch.no_grad()
def measure_tau(target, head: JetSpecHead, prompts: list[list[int]], max_new_tokens: int = 64,
                tree_budget: int | None = None) -> float:
    """Mean tokens per target forward of greedy JetSpec decoding with the head alone (no retrieval: the head's own
    acceptance, independent of any timing) over ``prompts`` (token id lists)."""
    if not prompts:
        return float("nan")
    was_training = head.training
    head.eval()
    device = next(target.parameters()).device
    param = next(target.parameters())
    draft = head if next(head.parameters()).dtype == param.dtype else _cast_copy(head, param.dtype)
    accepted, steps = 0, 0
    for ids in prompts:
        out = target.generate(torch.tensor([ids], device=device), do_sample=False, max_new_tokens=max_new_tokens,
                              custom_generate=jetspec_generate, draft_head=draft, tree_budget=tree_budget,
                              retrieval=False, return_dict_in_generate=True)
        accepted += sum(out.accept_lengths)
        steps += len(out.accept_lengths)
    head.train(was_training)
    return accepted / max(1, steps)


def _cast_copy(head: JetSpecHead, dtype: torch.dtype) -> JetSpecHead:
    copy = JetSpecHead(head.config).to(device=next(head.parameters()).device, dtype=dtype)
    copy.load_state_dict(head.state_dict())
    return copy.eval()


def train_head(target, head: JetSpecHead, train_dataset, args: TrainingArguments, *, num_anchors: int = 16,
               kd_temperature: float = 1.0, depth_decay: float | None = None, eval_prompts=None,
               eval_max_new_tokens: int = 64, seed: int = 0, logits_dtype: torch.dtype | None = None,
               sample_slots: bool = False, resume_from_checkpoint: str | bool | None = None,
               feature_noise: float = 0.0, acceptance_weight: float = 0.0, fixed_anchors: bool = False,
               eval_sequences: list[dict] | None = None, train_sequences: list[dict] | None = None,
               reference_head: JetSpecHead | None = None, callbacks=None) -> JetSpecTrainer:
    """Train ``head`` on ``train_dataset`` (SequenceDataset or StoreDataset); returns the finished trainer."""
    trainer = JetSpecTrainer(
        model=head,
        args=args,
        train_dataset=train_dataset,
        data_collator=AnchorCollator(num_anchors, seed, fixed_anchors),
        callbacks=callbacks,
        feature_noise=feature_noise,
        acceptance_weight=acceptance_weight,
        eval_sequences=eval_sequences,
        train_sequences=train_sequences,
        reference_head=reference_head,
        eval_dataset=eval_prompts,
        target=target,
        kd_temperature=kd_temperature,
        depth_decay=depth_decay,
        eval_max_new_tokens=eval_max_new_tokens,
        logits_dtype=logits_dtype,
        sample_slots=sample_slots,
    )
    trainer.train(resume_from_checkpoint=resume_from_checkpoint)
    return trainer


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="hf-jetspec train", description="Train a JetSpec head with the Trainer.")
    p.add_argument("--data", required=True, nargs="+",
                   help="JSONL file(s) of {id, input_ids, prompt_len} or answer store folder(s) (see "
                        "hf_jetspec.training.data); the --eval-count evaluation rows come from the first file, so "
                        "adding files keeps them")
    p.add_argument("--features", default=None, nargs="+",
                   help="feature store folder(s): used as they are when they exist (e.g. recorded by the data "
                        "generator with --states-dir); a single missing folder is built from the data on first "
                        "use. Every stored sequence trains except the evaluation rows and held-out conversations")
    p.add_argument("--model", default=None, help="target folder / Hub id (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--init-head", default=None, help="start from this head instead of a fresh one")
    p.add_argument("--init-from-target", action="store_true",
                   help="start a fresh head from the target's last --head-layers decoder layers and final norm, "
                        "with a fusion that passes the deepest tap through (hf_jetspec.training.init)")
    p.add_argument("--resume-from-checkpoint", default=None,
                   help="a Trainer checkpoint folder to resume (head, optimizer, scheduler, step); 'last' = the "
                        "newest checkpoint in --output-dir")
    p.add_argument("--head-layers", type=int, default=2)
    p.add_argument("--taps", type=int, default=3)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-anchors", type=int, default=16)
    p.add_argument("--max-length", type=int, default=1024)
    p.add_argument("--kd-temperature", type=float, default=1.0)
    p.add_argument("--depth-decay", type=float, default=None, help="exponential depth-weight decay (default uniform)")
    p.add_argument("--sample-slots", action="store_true",
                   help="with --depth-decay: supervise slot k with probability w_k instead of weighting it by w_k "
                        "(same objective in expectation, far less LM-head work per anchor: use more --num-anchors)")
    p.add_argument("--feature-noise", type=float, default=0.0,
                   help="add U(-a, a) noise to the target features while training (EAGLE uses 0.1)")
    p.add_argument("--dropout", type=float, default=None, help="residual dropout in the head's layers while training")
    p.add_argument("--acceptance-loss", type=float, default=0.0,
                   help="lambda: add lambda * (1 - sum min(p, q)) per slot (speculative sampling's rejection "
                        "probability) to the forward KL")
    p.add_argument("--fixed-anchors", action="store_true",
                   help="draw each sequence's anchors once (the same every epoch) instead of fresh each epoch")
    p.add_argument("--max-prompt-tokens", type=int, default=None,
                   help="keep the last N prompt tokens of each row (bounds the target pass over long histories)")
    p.add_argument("--early-stopping", type=int, default=None, metavar="PATIENCE",
                   help="stop after PATIENCE evaluations without a better held-out chain tau and keep the best "
                        "checkpoint (evaluates every --eval-steps on the --eval-count held-out sequences)")
    p.add_argument("--eval-train-count", type=int, default=0,
                   help="also evaluate the chain tau of this many rows the head trains on (a fixed random draw), "
                        "logging eval_train_chain_tau and the gap eval_chain_tau_gap (trained minus held-out) at "
                        "every evaluation; the rows' composition alone makes a gap: read it with --eval-reference")
    p.add_argument("--eval-reference", default=None, metavar="HEAD",
                   help="a head that saw neither the held-out nor the --eval-train-count rows (e.g. the shipped "
                        "one): its chain tau on the same held-out and trained rows says how much easier the trained "
                        "rows are; the trained head's excess over that is logged as eval_memorisation")
    p.add_argument("--eval-decode-count", type=int, default=8,
                   help="of the held-out rows, how many prompts are decoded for eval_tau (decoding is slow)")
    p.add_argument("--draft-vocab", type=int, default=None,
                   help="give the trained head a draft vocabulary: the N most frequent response tokens (plus eos)")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--warmup-ratio", type=float, default=0.04)
    p.add_argument("--eval-count", type=int, default=8, help="held-out prompts for tau evaluation")
    p.add_argument("--eval-steps", type=int, default=500)
    p.add_argument("--save-steps", type=int, default=500)
    p.add_argument("--logging-steps", type=int, default=10)
    p.add_argument("--bf16", action="store_true",
                   help="bf16 mixed precision for the head (CUDA; CPU autocast without one)")
    p.add_argument("--target-dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.add_argument("--logits-dtype", choices=("float32", "bfloat16"), default=None,
                   help="dtype of the LM-head matmuls in the loss (default: the target's); bfloat16 made "
                        "training steps ~1.5x faster on this project's AVX512-BF16 CPU (docs/training.md)")
    p.add_argument("--base-model", default=None,
                   help="the target's name for the model card (default: --model, or the embedded SmolLM2's Hub id)")
    p.add_argument("--dataset-name", default="anon8231489123/ShareGPT_Vicuna_unfiltered",
                   help="Hub id of the prompt source, for the model card (default: ShareGPT V3, as packaged)")
    p.add_argument("--data-description", default="prompts from the dataset; responses regenerated by the target "
                   "itself (greedy, its chat template)", help="how the training text was made, for the model card")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.init_head and args.init_from_target:
        p.error("--init-head and --init-from-target both choose the starting weights: give one")
    check_ranges(p, args)
    if args.eval_reference and not (args.eval_count and args.eval_train_count):
        p.error("--eval-reference compares the gap between held-out and trained rows: give --eval-count and "
                "--eval-train-count too")
    return args


def check_ranges(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Numbers the Trainer would take silently (``--max-steps 0`` ran one step, ``--epochs 0`` saved an untrained
    head) or fail on mid-run (a zero KD temperature divides the logits by 0): one error naming the option."""
    require_at_least(p, args, batch_size=1, grad_accum=1, head_layers=1, taps=1, num_anchors=1, max_length=1,
                     eval_count=0, eval_train_count=0, eval_decode_count=0, eval_steps=1, save_steps=1,
                     logging_steps=1, early_stopping=1, max_prompt_tokens=1, draft_vocab=1)
    if args.max_steps == 0 or args.max_steps < -1:
        p.error(f"--max-steps must be >= 1 (or -1: train --epochs), got {args.max_steps}")
    if args.max_steps == -1 and not args.epochs > 0:
        p.error(f"--epochs must be > 0, got {args.epochs}")
    positive = {"lr": args.lr, "kd_temperature": args.kd_temperature, "depth_decay": args.depth_decay}
    for name, value in positive.items():
        if value is not None and not value > 0:  # also refuses nan
            p.error(f"--{name.replace('_', '-')} must be > 0, got {value}")
    for name, value, high in (("feature_noise", args.feature_noise, None), ("acceptance_loss", args.acceptance_loss,
                              None), ("warmup_ratio", args.warmup_ratio, 1.0), ("dropout", args.dropout, 1.0)):
        if value is not None and not (value >= 0 and (high is None or value < high)):
            p.error(f"--{name.replace('_', '-')} must be >= 0{f' and < {high:g}' if high else ''}, got {value}")


# what a run writes into --output-dir besides the Trainer's checkpoint-* folders
OUTPUT_FILES = ("config.json", "model.safetensors", "README.md", "log_history.json", "train_summary.json",
                "training_args.bin")


def is_head_folder(folder: Path) -> bool:
    """``folder`` holds a JetSpec head (an earlier run's output), which a new run may replace."""
    return json_field(folder / "config.json", "model_type") == "jetspec"


def check_token_ids(rows: list[dict], vocab: int, paths) -> None:
    """Refuse rows with token ids outside the target's embedding table (data made for another tokenizer)."""
    bad = next((r for r in rows if r["input_ids"] and not 0 <= min(r["input_ids"]) <= max(r["input_ids"]) < vocab),
               None)
    if bad is not None:
        raise ValueError(f"row {bad['id']!r} of {' '.join(map(str, paths))} holds token ids outside the target's "
                         f"vocabulary [0, {vocab}) (range {min(bad['input_ids'])}..{max(bad['input_ids'])}): "
                         "data tokenized for another model?")


def main(argv=None) -> int:
    from hf_jetspec.models import load_target
    from hf_jetspec.models import SMOLLM2_HUB_ID

    args = parse_args(argv)
    refuse_foreign_files(args.output_dir, OUTPUT_FILES, is_head_folder, "--output-dir")
    files = [read_rows(path) for path in args.data]
    all_rows = [r for rows in files for r in rows]
    train_rows, eval_rows = split_rows(files, args.eval_count, args.seed)
    train_rows, eval_rows = cap_prompts(train_rows, args.max_prompt_tokens), cap_prompts(eval_rows,
                                                                                        args.max_prompt_tokens)
    eval_prompts = [r["input_ids"][: r["prompt_len"]] for r in eval_rows[: args.eval_decode_count]]
    not_trained = {str(r["id"]) for r in all_rows} - {str(r["id"]) for r in train_rows}  # held out or eval
    target, tokenizer = load_target(args.model, args.target_dtype, None)
    check_token_ids(all_rows, target.get_input_embeddings().weight.shape[0], args.data)
    store = None
    if args.features:
        missing = [d for d in args.features if not (Path(d) / "meta.json").exists()]
        if missing and len(args.features) > 1:
            raise ValueError(f"feature stores not found: {missing} (only a single --features folder is built)")
        if not missing:
            store = FeatureStore(*args.features)  # e.g. recorded during data generation
    prior = copied = None
    if args.init_head:
        head = JetSpecHead.from_pretrained(args.init_head)
        prior = head.config.training_summary
    else:
        torch.manual_seed(args.seed)
        taps = {"target_layer_ids": store.layer_ids} if store is not None else {"num_taps": args.taps}
        head = JetSpecHead.for_target(target, num_hidden_layers=args.head_layers, block_size=args.block_size, **taps)
        if args.init_from_target:
            copied = init_from_target(head, target)
    reference = None
    if args.eval_reference:
        reference = JetSpecHead.from_pretrained(args.eval_reference)
        reference.check_target(target)
    if args.dropout is not None:
        head.config.dropout = args.dropout
        head.config.validate_head()
        for layer in head.layers:
            layer.dropout = args.dropout
    if args.features and store is None:
        from .features import build_feature_store

        store = FeatureStore(build_feature_store(target, train_rows, head.config.target_layer_ids,
                                                 args.features[0]))
    if store is not None:
        if store.layer_ids != head.config.target_layer_ids:
            raise ValueError(f"feature store taps {store.layer_ids} != head taps {head.config.target_layer_ids}")
        dataset = StoreDataset(store, exclude=not_trained)
    else:
        dataset = SequenceDataset(train_rows, args.max_length)
    if len(dataset) == 0:
        raise ValueError(f"no training rows in {' '.join(map(str, args.data))}: every row is an evaluation or "
                         "held-out row, or has no answer tokens after its prompt (prompt_len = its length)")
    trained_ids = dataset.ids()
    probe = [r for r in train_rows if str(r["id"]) in trained_ids]
    probe = random.Random(args.seed).sample(probe, min(args.eval_train_count, len(probe)))
    training_args = TrainingArguments(
        output_dir=args.output_dir,
        num_train_epochs=args.epochs,
        max_steps=args.max_steps,
        learning_rate=args.lr,
        lr_scheduler_type="cosine",
        warmup_steps=args.warmup_ratio,  # a float in [0, 1) is a ratio of the total steps
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        logging_steps=args.logging_steps,
        eval_strategy="steps" if args.eval_count or probe else "no",
        eval_steps=args.eval_steps,
        save_steps=args.eval_steps if args.early_stopping else args.save_steps,  # best-checkpoint tracking
        save_total_limit=2,
        **({"load_best_model_at_end": True, "metric_for_best_model": "chain_tau", "greater_is_better": True}
           if args.early_stopping else {}),
        bf16=args.bf16,
        use_cpu=not torch.cuda.is_available(),  # also makes --bf16 mean CPU autocast on machines without CUDA
        remove_unused_columns=False,
        report_to=[],
        seed=args.seed,
        dataloader_num_workers=0,
    )
    trainer = train_head(target, head, dataset, training_args, num_anchors=args.num_anchors,
                         kd_temperature=args.kd_temperature, depth_decay=args.depth_decay,
                         eval_prompts=eval_prompts,
                         logits_dtype=getattr(torch, args.logits_dtype) if args.logits_dtype else None,
                         sample_slots=args.sample_slots,
                         feature_noise=args.feature_noise, acceptance_weight=args.acceptance_loss,
                         fixed_anchors=args.fixed_anchors, eval_sequences=eval_rows, train_sequences=probe,
                         reference_head=reference,
                         callbacks=[EarlyStoppingCallback(args.early_stopping)] if args.early_stopping else None,
                         resume_from_checkpoint=True if args.resume_from_checkpoint == "last"
                         else args.resume_from_checkpoint)
    if args.draft_vocab:
        head.config.draft_vocab = frequent_tokens(train_rows, args.draft_vocab, eos_token_ids(target, tokenizer),
                                                  head.config.vocab_size)
        head.config.validate_head()
    tau = measure_tau(target, head, eval_prompts, 128) if eval_prompts else None
    final = trainer.evaluate() if eval_rows or probe else {}
    chain, trained = final.get("eval_chain_tau"), final.get("eval_train_chain_tau")
    excess = final.get("eval_memorisation")
    regularisation = {name: value for name, value in (
        ("feature_noise", args.feature_noise), ("dropout", args.dropout), ("acceptance_loss", args.acceptance_loss),
        ("fixed_anchors", args.fixed_anchors), ("early_stopping_patience", args.early_stopping),
        ("max_prompt_tokens", args.max_prompt_tokens)) if value}
    head.config.base_model = args.base_model or (SMOLLM2_HUB_ID if args.model is None else args.model)
    head.config.training_summary = {
        "datasets": [args.dataset_name],
        "data": args.data_description,
        "sequences": len(dataset),
        "steps": trainer.state.global_step,
        "epochs": round(trainer.state.epoch or 0.0, 3),
        "learning_rate": args.lr,
        "anchors_per_sequence": args.num_anchors,
        "loss": "forward KL(target || head), uniform depth weights" if args.depth_decay is None
        else f"forward KL(target || head), depth decay {args.depth_decay}"
        + (" (slots sampled with probability w_k)" if args.sample_slots else ""),
        **({"tau_held_out": round(tau, 3)} if tau is not None else {}),
        **({"chain_tau_held_out": round(chain, 3)} if chain is not None else {}),
        **({"chain_tau_trained": round(trained, 3)} if trained is not None else {}),
        **({"memorisation": {"trained_minus_composition": round(excess, 3),
                             "reference_head": str(args.eval_reference),
                             "reference_chain_tau": {"held_out": round(final["eval_reference_chain_tau"], 3),
                                                     "trained": round(final["eval_reference_train_chain_tau"], 3)}}}
           if excess is not None else {}),
        **({"regularisation": regularisation} if regularisation else {}),
        **({"draft_vocab": f"{len(head.config.draft_vocab)} most frequent response tokens"}
           if args.draft_vocab else {}),
        **({"continued_from": {"head": str(args.init_head), **prior}} if prior else {}),
        **({"initialised_from": f"the target's decoder layers {copied['layers']} and final norm; fusion passes "
                                "the deepest tap through"} if copied else {}),
    }
    trainer.save_model(args.output_dir)
    (Path(args.output_dir) / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))
    (Path(args.output_dir) / "train_summary.json").write_text(json.dumps(head.config.training_summary, indent=2))
    shown = {"held-out tau": tau, "held-out chain tau": chain, "trained chain tau": trained,
             "memorisation (trained chain tau above what the rows' composition explains)": excess}
    print("; ".join(f"{k} {v:.3f}" for k, v in shown.items() if v is not None) + f"; saved to {args.output_dir}")
    return 0 if tau is None or math.isfinite(tau) else 1
