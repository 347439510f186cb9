"""The one registry of decoding strategies: name -> how ``model.generate()`` runs it.

Used by the package (``hf_jetspec.DECODING_FUNCTIONS``, the ``custom_generate`` folder), the CLI (``generate
--strategy``) and the benchmark (``bench --strategies``). Adding a strategy is one `StrategySpec` entry.

The registry imports neither torch nor transformers (the decoding functions are named ``"module:function"`` and
imported on first use), so the command line checks strategy names before it pays for those imports.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch


def resolve(entry: str) -> Callable:
    """The function ``"module:function"`` names under ``hf_jetspec`` (imported now)."""
    module, _, name = entry.partition(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


@dataclass
class Resources:
    """What strategies need besides the target: the head, a draft model, the reference output (oracle) and the
    settings of the training-free baselines."""

    head: object | None = None
    draft_model: object | None = None
    datastore: object | None = None  # a CorpusIndex for the retrieval strategies (default: the head's)
    calibration_log: list | None = None  # receives merged trees' calibration records (hf_jetspec.calibration)
    block_size: int = 16  # the oracle drafter's block
    prompt_lookup_tokens: int = 10
    jacobi_pool: int = 8  # pool n-grams verified per forward by 'jacobi-pool'


@dataclass(frozen=True)
class StrategySpec:
    """``entry``: the ``custom_generate`` callable, or its name ``"module:function"`` under ``hf_jetspec`` (imported
    by `function` on first use), or None: transformers' own decoding, steered by ``options``;
    ``options``: fixed extra ``generate()`` kwargs; ``tuned``: kwargs taken from the `Resources` settings;
    ``needs``: what it takes from `Resources` (``"head"``, ``"draft_model"``; ``"datastore"`` is optional) or
    ``"reference"`` (plain greedy's output: benchmark only); ``budgeted``: takes a tree budget (the benchmark
    expands it over ``--budgets``)."""

    name: str
    description: str
    entry: str | Callable | None = None
    options: dict = field(default_factory=dict)
    tuned: Callable[[Resources], dict] | None = None
    needs: tuple[str, ...] = ()
    budgeted: bool = False

    @property
    def function(self) -> Callable | None:
        """The ``custom_generate`` callable (imported on first use), or None for transformers' own decoding."""
        return resolve(self.entry) if isinstance(self.entry, str) else self.entry

    def generate_kwargs(self, resources: Resources, budget: int | None = None,
                        reference: torch.Tensor | None = None, vocab: int | None = None) -> dict:
        """The kwargs that make ``model.generate()`` run this strategy (``do_sample`` and lengths not included)."""
        kwargs = dict(self.options) | (self.tuned(resources) if self.tuned is not None else {})
        if self.entry is not None:
            kwargs |= {"custom_generate": self.function, "return_dict_in_generate": True}
        if self.budgeted:
            kwargs["tree_budget"] = budget
        if "head" in self.needs:
            if resources.head is None:
                raise ValueError(f"The {self.name!r} strategy needs a draft head")
            kwargs["draft_head"] = resources.head
        if "draft_model" in self.needs:
            if resources.draft_model is None:
                raise ValueError(f"The {self.name!r} strategy needs a draft model (--draft-model or --draft-layers)")
            kwargs["assistant_model" if self.entry is None else "draft_model"] = resources.draft_model
        if "reference" in self.needs:
            if reference is None:
                raise ValueError(f"The {self.name!r} strategy needs the reference output (benchmark only)")
            from .drafters import OracleDrafter

            kwargs["drafter"] = OracleDrafter(reference, vocab, resources.block_size)
        return kwargs


def _registry(*specs: StrategySpec) -> dict[str, StrategySpec]:
    return {spec.name: spec for spec in specs}


JACOBI, SPEC_JACOBI = "decoding.jacobi:jacobi_generate", "decoding.spec_jacobi:speculative_jacobi_generate"
JETSPEC, SUFFIX = "decoding.jetspec:jetspec_generate", "decoding.suffix:suffix_generate"

STRATEGIES: dict[str, StrategySpec] = _registry(
    StrategySpec("ar", "plain generate() (the baseline)"),
    StrategySpec("prompt-lookup", "transformers' prompt lookup decoding (n-gram match in the prompt, a chain)",
                 tuned=lambda r: {"prompt_lookup_num_tokens": r.prompt_lookup_tokens}),
    StrategySpec("assisted", "transformers' assisted decoding with a draft model", needs=("draft_model",)),
    StrategySpec("jacobi", "Jacobi decoding, new slots guessed by n-gram lookup", JACOBI),
    StrategySpec("jacobi-pad", "Jacobi decoding, textbook pad initialisation", JACOBI, {"init": "pad"}),
    StrategySpec("jacobi-pool", "Jacobi decoding plus a Lookahead-style n-gram pool", JACOBI,
                 tuned=lambda r: {"ngram_pool": r.jacobi_pool}),
    StrategySpec("spec-jacobi", "speculative Jacobi decoding with a draft model", SPEC_JACOBI, needs=("draft_model",)),
    StrategySpec("suffix", "suffix decoding: retrieval trees from the prompt, the output and the head's datastore "
                 "(no head)", SUFFIX, tuned=lambda r: {"datastore": r.datastore}, needs=("datastore",)),
    StrategySpec("jetspec", "JetSpec: the head's drafts merged with retrieval in one calibrated tree", JETSPEC,
                 tuned=lambda r: {} if r.datastore is None else {"retrieval": r.datastore},
                 needs=("head", "datastore"), budgeted=True),
    StrategySpec("jetspec-head", "JetSpec with the head alone (no retrieval)", JETSPEC, {"retrieval": False},
                 needs=("head",), budgeted=True),
    StrategySpec("jetspec-chain", "JetSpec with a linear draft (chain)", JETSPEC, {"tree_builder": "chain"},
                 needs=("head",), budgeted=True),
    StrategySpec("jetspec-rrs", "JetSpec tree, recursive-rejection sampling rule", JETSPEC, {"sampling_rule": "rrs"},
                 needs=("head",), budgeted=True),
    StrategySpec("jetspec-oracle", "JetSpec drafting plain greedy's own output (upper bound)", JETSPEC,
                 {"retrieval": False}, needs=("reference",), budgeted=True),
)

# The custom_generate callables by name (``DECODING_FUNCTIONS``, computed on first access: it imports the loops).
DECODING_NAMES = {"jetspec": JETSPEC, "suffix": SUFFIX, "jacobi": JACOBI, "spec-jacobi": SPEC_JACOBI}


def decoding_functions() -> dict[str, Callable]:
    """The custom_generate callables by name (also ``DECODING_FUNCTIONS``)."""
    return {name: resolve(entry) for name, entry in DECODING_NAMES.items()}


def __getattr__(name: str):
    if name == "DECODING_FUNCTIONS":
        return decoding_functions()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get_strategy(name: str) -> StrategySpec:
    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")
    return STRATEGIES[name]
