"""Tree verification attention for speculative decoding.

The target model verifies a draft tree with ONE forward over its ``N`` nodes on top of its KV cache.
Queries are the tree nodes; keys/values (already updated by the cache) are laid out as
``[prefix (P slots) ; tree nodes (N slots) ; unused static-cache slack]``. Query node ``i`` attends to
every prefix key and to tree key ``j`` (slot ``P + j``) iff ``j`` is an ancestor of ``i`` or ``i`` itself.
Nodes are in topological order (parent index < child index) and node 0 is the root.

Two implementations with identical semantics and output layout ``[B, N, Hq, D]``:

* :func:`tree_attention` -- a Triton split-KV flash-attention kernel (online softmax over key tiles, fp32
  accumulation). The prefix is cut into chunks processed by parallel programs without any mask reads (only a
  bounds check); the last chunk's programs then also walk the N tree keys, reading the packed ancestor
  bitmask. When there is more than one chunk a second small kernel merges them by log-sum-exp. Query rows
  are ``(node, head-in-GQA-group)`` pairs, so each K/V tile is loaded once per KV head, not once per query head.
* :func:`sdpa_tree_reference` -- PyTorch SDPA with a dense additive float mask (tests, CPU fallback).

``TRITON_INTERPRET=1`` runs the kernel on CPU tensors through the Triton interpreter. Triton fixes that mode
for its own language helpers when it is first imported, so the variable must be set before anything in the
process imports Triton (transformers does when its model classes load); :func:`kernel_available` reports
False on CPU otherwise. This module imports fine without Triton (only the SDPA reference then works).
"""

from __future__ import annotations  # kernel annotations (tl.constexpr) stay strings: importable without Triton

import contextlib
import dataclasses
import math

import torch
import torch.nn.functional as F

try:
    import triton
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
except ImportError:  # CPU-only installs: only the SDPA reference is available
    triton = None


def _jit(fn):
    """``triton.jit`` when Triton is installed; otherwise the kernel stays a plain function that is never launched."""
    return fn if triton is None else triton.jit(fn)


_BITS_PER_WORD = 32
_SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_MIN_BLOCKS_PER_SPLIT = 2  # keeps the per-split partial write + merge small next to the split's K/V reads
_MERGE_BLOCK_ROWS = 16


@dataclasses.dataclass(frozen=True, eq=False)
class TreeMeta:
    """Shape of one draft tree verified on top of ``prefix_len`` cached tokens.

    Attributes:
        prefix_len: P, number of cached tokens before the tree (the tree occupies key slots ``P .. P+N-1``).
        ancestor_bits: int32 ``[N, ceil(N / 32)]``; bit ``j % 32`` of word ``j // 32`` in row ``i`` is set
            iff node ``j`` is an ancestor of node ``i`` or ``i`` itself.
        num_nodes: N, number of tree nodes (queries).
    """

    prefix_len: int
    ancestor_bits: torch.Tensor
    num_nodes: int

    @classmethod
    def from_parents(cls, parents: torch.Tensor, prefix_len: int) -> TreeMeta:
        """Build from ``parents: LongTensor[N]`` (``-1`` for the root at index 0, ``parents[i] < i`` otherwise)."""
        parents = parents.long()
        _check_parents(parents)
        return cls.from_ancestor_matrix(_ancestor_matrix(parents), prefix_len)

    @classmethod
    def from_ancestor_matrix(cls, ancestors: torch.Tensor, prefix_len: int) -> TreeMeta:
        """Build from ``ancestors: bool[N, N]`` with ``ancestors[i, j]`` iff ``j`` is an ancestor-or-self of ``i``."""
        _check_ancestor_matrix(ancestors)
        if prefix_len < 0:
            raise ValueError(f"prefix_len must be >= 0, got {prefix_len}")
        return cls(int(prefix_len), _pack_bits(ancestors.bool()), ancestors.shape[0])

    def to(self, device: torch.device | str) -> TreeMeta:
        """The same tree with ``ancestor_bits`` on ``device`` (build it once per step on the model's device)."""
        return dataclasses.replace(self, ancestor_bits=self.ancestor_bits.to(device))

    def ancestor_matrix(self) -> torch.Tensor:
        """Unpacked ancestor-or-self matrix, ``bool[N, N]`` on the device of ``ancestor_bits``."""
        bit = torch.arange(_BITS_PER_WORD, device=self.ancestor_bits.device, dtype=torch.int32)
        unpacked = (self.ancestor_bits.unsqueeze(-1) >> bit).bitwise_and(1).bool()  # [N, W, 32]
        return unpacked.flatten(1)[:, : self.num_nodes]

    def visibility(self, key_len: int) -> torch.Tensor:
        """Dense ``bool[N, key_len]`` mask: True where query node ``i`` may attend key slot ``s``.

        Slots ``>= P + N`` (static-cache slack) are never visible.
        """
        end = self.prefix_len + self.num_nodes
        if key_len < end:
            raise ValueError(f"key length {key_len} < prefix_len + num_nodes = {end}")
        device = self.ancestor_bits.device
        visible = torch.zeros(self.num_nodes, key_len, dtype=torch.bool, device=device)
        visible[:, : self.prefix_len] = True
        visible[:, self.prefix_len : end] = self.ancestor_matrix()
        return visible


def _check_parents(parents: torch.Tensor) -> None:
    """Validate a parent array ``[N]``: root at 0 with parent -1, then ``0 <= parents[i] < i``."""
    if parents.ndim != 1 or parents.numel() == 0:
        raise ValueError(f"parents must be a non-empty 1-D tensor, got shape {tuple(parents.shape)}")
    index = torch.arange(parents.numel(), device=parents.device)
    ok = bool(parents[0] == -1) and bool(((parents[1:] >= 0) & (parents[1:] < index[1:])).all())
    if not ok:
        raise ValueError("parents must be topologically ordered: parents[0] == -1 and 0 <= parents[i] < i")


def _ancestor_matrix(parents: torch.Tensor) -> torch.Tensor:
    """Ancestor-or-self matrix ``bool[N, N]`` from ``parents[N]``: `hf_jetspec.tree.ancestor_matrix`, the one
    ancestor routine (imported on call: see this package's ``__init__`` on import order)."""
    from ..tree import ancestor_matrix

    return ancestor_matrix(parents)


def _check_ancestor_matrix(ancestors: torch.Tensor) -> None:
    """Validate ``bool[N, N]``: self included, root (node 0) an ancestor of all, ancestors precede descendants."""
    if ancestors.ndim != 2 or ancestors.shape[0] != ancestors.shape[1] or ancestors.shape[0] == 0:
        raise ValueError(f"ancestor matrix must be [N, N] with N > 0, got {tuple(ancestors.shape)}")
    ancestors = ancestors.bool()
    if not bool(ancestors.diagonal().all()):
        raise ValueError("ancestor matrix must include every node itself (diagonal all True)")
    if not bool(ancestors[:, 0].all()):
        raise ValueError("node 0 must be the root (an ancestor of every node)")
    if bool(ancestors.triu(diagonal=1).any()):
        raise ValueError("nodes must be topologically ordered (ancestor index < descendant index)")


def _pack_bits(ancestors: torch.Tensor) -> torch.Tensor:
    """Pack ``bool[N, N]`` into int32 ``[N, ceil(N / 32)]`` (bit ``j % 32`` of word ``j // 32``)."""
    n = ancestors.shape[0]
    words = -(-n // _BITS_PER_WORD)
    padded = F.pad(ancestors.long(), (0, words * _BITS_PER_WORD - n)).view(n, words, _BITS_PER_WORD)
    weights = 1 << torch.arange(_BITS_PER_WORD, device=ancestors.device, dtype=torch.long)
    packed = (padded * weights).sum(-1)  # [N, W] in [0, 2^32)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def sdpa_tree_reference(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, meta: TreeMeta, scaling: float
) -> torch.Tensor:
    """Tree attention via SDPA with a dense additive float mask.

    Args:
        query: ``[B, Hq, N, D]``.
        key, value: ``[B, Hkv, S, D]`` with ``S >= P + N``; ``Hq % Hkv == 0``.
        meta: the tree.
        scaling: softmax scale.

    Returns:
        ``[B, N, Hq, D]`` in the query dtype.
    """
    groups = query.shape[1] // key.shape[1]
    visible = meta.visibility(key.shape[2]).to(query.device)
    bias = torch.zeros(visible.shape, dtype=query.dtype, device=query.device)
    bias.masked_fill_(~visible, float("-inf"))
    out = F.scaled_dot_product_attention(
        query,
        key.repeat_interleave(groups, dim=1),
        value.repeat_interleave(groups, dim=1),
        attn_mask=bias,
        scale=scaling,
    )
    return out.transpose(1, 2)


def kernel_available(device: torch.device | str) -> bool:
    """Whether :func:`tree_attention` can run on ``device``: CUDA with Triton compiling, or CPU with Triton
    interpreting (``TRITON_INTERPRET=1`` set before Triton was first imported)."""
    if triton is None:
        return False
    interpreting = isinstance(_tree_attention_split_kernel, InterpretedFunction)
    if interpreting != isinstance(tl.zeros, InterpretedFunction):  # variable changed between the two imports
        return False
    return torch.device(device).type == ("cpu" if interpreting else "cuda")


def tree_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    meta: TreeMeta,
    scaling: float,
    *,
    prefix_split_len: int | None = None,
) -> torch.Tensor:
    """Tree verification attention with the Triton kernel.

    Args:
        query: ``[B, Hq, N, D]`` (any strides with a unit last stride), D a power of two in [16, 256].
        key, value: ``[B, Hkv, S, D]``, same dtype as ``query`` (fp32/fp16/bf16), ``S >= P + N``,
            ``Hq % Hkv == 0`` (query head ``h`` reads KV head ``h // (Hq // Hkv)``). Slots ``>= P + N`` are ignored.
        meta: the tree (``meta.ancestor_bits`` is moved to the query device if needed; build it there).
        scaling: softmax scale.
        prefix_split_len: prefix keys per split (rounded up to the key tile); ``None`` picks it from the
            device's SM count. Exposed for tests and tuning.

    Returns:
        ``[B, N, Hq, D]`` in the query dtype (fp32 accumulation).
    """
    _check_kernel_inputs(query, key, value, meta)
    query, key, value = (t if t.stride(-1) == 1 else t.contiguous() for t in (query, key, value))
    batch, num_q_heads, num_nodes, head_dim = query.shape
    num_kv_heads = key.shape[1]
    group_size = num_q_heads // num_kv_heads
    tiles = _tile_config(head_dim, query.dtype, num_nodes * group_size)
    row_blocks = triton.cdiv(num_nodes * group_size, tiles.block_m)
    programs_per_split = row_blocks * batch * num_kv_heads
    split_len = _split_len(meta.prefix_len, tiles.block_n, programs_per_split, query.device, prefix_split_len)
    num_splits = max(1, triton.cdiv(meta.prefix_len, split_len))

    out = torch.empty(batch, num_nodes, num_q_heads, head_dim, device=query.device, dtype=query.dtype)
    o_part, lse_part, part_strides = _split_buffers(out, num_splits)
    bits = meta.ancestor_bits.to(query.device)
    with _on_device(query.device):
        _tree_attention_split_kernel[(row_blocks, batch * num_kv_heads, num_splits)](
            query, key, value, bits, o_part, lse_part,
            *query.stride()[:3], *key.stride()[:3], *value.stride()[:3], *part_strides,
            num_nodes, meta.prefix_len, bits.shape[1], num_kv_heads, group_size, split_len, num_splits,
            scaling * math.log2(math.e),
            BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, HEAD_DIM=head_dim,
            DOT_DTYPE=_dot_dtype(query.dtype, interpreting=query.device.type == "cpu"),
            DOT_PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
            WRITE_LSE=num_splits > 1,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages,
        )  # fmt: skip
        if num_splits > 1:
            num_rows = batch * num_q_heads * num_nodes
            _merge_splits_kernel[(triton.cdiv(num_rows, _MERGE_BLOCK_ROWS),)](
                o_part, lse_part, out, num_rows, num_q_heads, num_nodes, num_splits,
                BLOCK_R=_MERGE_BLOCK_ROWS, HEAD_DIM=head_dim, num_warps=4,
            )  # fmt: skip
    return out


def _split_buffers(out: torch.Tensor, num_splits: int) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
    """Where the split kernel writes, given ``out [B, N, Hq, D]``.

    Returns ``(o_part, lse_part, strides of o_part over (b, q_head, node, split))``: ``out`` itself (and an unused
    ``lse_part``) for a single split, else fp32 ``[B, Hq, N, splits, D]`` and ``[B, Hq, N, splits]`` buffers.
    """
    if num_splits == 1:
        return out, out, (out.stride(0), out.stride(2), out.stride(1), 0)
    batch, num_nodes, num_q_heads, head_dim = out.shape
    o_part = torch.empty(batch, num_q_heads, num_nodes, num_splits, head_dim, device=out.device, dtype=torch.float32)
    lse_part = torch.empty(batch, num_q_heads, num_nodes, num_splits, device=out.device, dtype=torch.float32)
    return o_part, lse_part, o_part.stride()[:4]


def _check_kernel_inputs(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, meta: TreeMeta) -> None:
    """Raise unless the shapes/dtypes/devices fit :func:`tree_attention`."""
    if triton is None:
        raise RuntimeError("tree_attention needs Triton; use sdpa_tree_reference instead")
    if query.ndim != 4 or key.ndim != 4 or key.shape != value.shape:
        shapes = f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        raise ValueError(f"expected query [B,Hq,N,D] and key/value [B,Hkv,S,D]; got {shapes}")
    batch, num_q_heads, num_nodes, head_dim = query.shape
    if key.shape[0] != batch or key.shape[3] != head_dim or num_q_heads % key.shape[1] != 0:
        raise ValueError(f"incompatible query {tuple(query.shape)} and key {tuple(key.shape)} (need Hq % Hkv == 0)")
    if num_nodes != meta.num_nodes or key.shape[2] < meta.prefix_len + meta.num_nodes:
        raise ValueError(f"query has {num_nodes} nodes and key {key.shape[2]} slots; tree needs N={meta.num_nodes}, "
                         f"S >= {meta.prefix_len + meta.num_nodes}")  # fmt: skip
    if head_dim < 16 or head_dim > 256 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two in [16, 256], got {head_dim}")
    if query.dtype not in _SUPPORTED_DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        dtypes = f"{query.dtype}, {key.dtype}, {value.dtype}"
        raise ValueError(f"query/key/value must share one dtype of {_SUPPORTED_DTYPES}; got {dtypes}")
    if not kernel_available(query.device) or key.device != query.device or value.device != query.device:
        raise ValueError(f"the Triton kernel cannot run on {query.device} (see kernel_available)")


@dataclasses.dataclass(frozen=True)
class _Tiles:
    block_m: int  # query rows (node, head-in-group) per program
    block_n: int  # keys per inner-loop step
    num_warps: int
    num_stages: int


def _tile_config(head_dim: int, dtype: torch.dtype, num_rows: int) -> _Tiles:
    """Tile sizes for Hopper (H100/H200): with them an offline sm_90a build of the 16-bit kernels neither spills
    registers nor serialises wgmma (fp32, a rare case on GPU, is given smaller query tiles).

    ``block_m`` shrinks to the number of query rows when that is smaller (short trees without GQA).
    """
    if dtype == torch.float32:
        tiles = _Tiles(block_m=16 if head_dim >= 256 else 32, block_n=64, num_warps=8, num_stages=2)
    elif head_dim <= 64:
        tiles = _Tiles(block_m=64, block_n=64, num_warps=4, num_stages=3)
    elif head_dim <= 128:
        tiles = _Tiles(block_m=64, block_n=64, num_warps=8, num_stages=2)
    else:
        tiles = _Tiles(block_m=64, block_n=32, num_warps=8, num_stages=2)
    return dataclasses.replace(tiles, block_m=min(tiles.block_m, max(16, triton.next_power_of_2(num_rows))))


def _split_len(
    prefix_len: int, block_n: int, programs_per_split: int, device: torch.device, requested: int | None
) -> int:
    """Prefix keys per split, a multiple of ``block_n``: by default enough splits for ~2 waves of programs."""
    if requested is not None:
        if requested <= 0:
            raise ValueError(f"prefix_split_len must be > 0, got {requested}")
        return triton.cdiv(requested, block_n) * block_n
    num_blocks = max(1, triton.cdiv(prefix_len, block_n))
    wanted_splits = max(1, triton.cdiv(2 * _sm_count(device), programs_per_split))
    return max(_MIN_BLOCKS_PER_SPLIT, triton.cdiv(num_blocks, wanted_splits)) * block_n


def _sm_count(device: torch.device) -> int:
    """Streaming multiprocessors on a CUDA device; 1 elsewhere (the CPU interpreter gains nothing from splits)."""
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def _on_device(device: torch.device) -> contextlib.AbstractContextManager:
    """Make ``device`` current so Triton launches there (models sharded with ``device_map``)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _dot_dtype(dtype: torch.dtype, interpreting: bool) -> tl.dtype:
    """Operand dtype of the kernel's two matmuls: the input dtype, except bf16 under the interpreter.

    Triton's interpreter multiplies bf16 ``tl.dot`` operands as raw uint16 bit patterns (unsupported there,
    triton-lang/triton#11584), so interpreted bf16 runs cast the operands to fp32 first.
    """
    if interpreting and dtype == torch.bfloat16:
        return tl.float32
    return {torch.float32: tl.float32, torch.float16: tl.float16, torch.bfloat16: tl.bfloat16}[dtype]


@_jit
def _attend_tile(
    acc, m_i, l_i, q, k_ptrs, v_ptrs, key_ok, visible, qk_scale_log2,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    """Fold one key tile into the running online-softmax state.

    Shapes: ``acc [M, D]``, ``m_i/l_i [M]`` (running max / sum, base 2), ``q [M, D]``, ``k_ptrs/v_ptrs [N, D]``,
    ``key_ok [N]`` (load mask), ``visible [M, N]``. Returns the updated ``(acc, m_i, l_i)``.
    """
    k = tl.load(k_ptrs, mask=key_ok[:, None], other=0.0)
    scores = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=DOT_PRECISION) * qk_scale_log2
    scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(scores - m_new[:, None])
    v = tl.load(v_ptrs, mask=key_ok[:, None], other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=DOT_PRECISION)
    return acc, m_new, l_i * alpha + tl.sum(p, 1)


@_jit
def _tree_attention_split_kernel(
    Q, K, V, Bits, OPart, LsePart,
    stride_qb, stride_qh, stride_qn,
    stride_kb, stride_kh, stride_ks,
    stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh, stride_on, stride_os,
    num_nodes, prefix_len, words_per_row, num_kv_heads, group_size, split_len, num_splits,
    qk_scale_log2,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, WRITE_LSE: tl.constexpr,
):  # fmt: skip
    """One (row block, batch x KV head, split) program: flash-attention online softmax over the split's keys.

    Grid: ``(cdiv(N * G, BLOCK_M), B * Hkv, num_splits)``; rows are ``(node, head-in-group)`` pairs
    (``row = node * G + g``) sharing every K/V tile. Split ``s`` covers prefix keys
    ``[s * split_len, (s + 1) * split_len)`` with a bounds check only; the last split also covers the tree keys
    ``[P, P + N)`` in a second loop that reads the ``Bits [N, W]`` ancestor bitmask.
    Writes the normalised output to ``OPart[b, q_head, node, s, :]`` (strides ``stride_o*``) and, if
    ``WRITE_LSE``, its base-2 log-sum-exp to ``LsePart [B, Hq, N, num_splits]`` (contiguous fp32).
    """
    pid_b = tl.program_id(1) // num_kv_heads
    kv_head = tl.program_id(1) % num_kv_heads
    split = tl.program_id(2)

    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < num_nodes * group_size
    rows = tl.where(row_ok, rows, 0)  # padded rows recompute row 0 and are not stored
    node = rows // group_size
    q_head = kv_head * group_size + rows % group_size
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + pid_b * stride_qb + q_head[:, None] * stride_qh + node[:, None] * stride_qn + dims[None, :])
    q = q.to(DOT_DTYPE)
    k_base = K + pid_b * stride_kb + kv_head * stride_kh + dims[None, :]
    v_base = V + pid_b * stride_vb + kv_head * stride_vh + dims[None, :]

    # Every row sees the split's first key (a prefix key, or the root when P = 0), so the running max is
    # finite after the first tile and needs no -inf guard.
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    prefix_end = tl.minimum((split + 1) * split_len, prefix_len)
    for start in range(split * split_len, prefix_end, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_ok = keys < prefix_end
        visible = tl.broadcast_to(key_ok[None, :], (BLOCK_M, BLOCK_N))
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, k_base + keys[:, None] * stride_ks, v_base + keys[:, None] * stride_vs,
            key_ok, visible, qk_scale_log2, DOT_DTYPE, DOT_PRECISION,
        )  # fmt: skip

    tree_end = tl.where(split == num_splits - 1, prefix_len + num_nodes, prefix_len)  # tree only in the last split
    for start in range(prefix_len, tree_end, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_ok = keys < tree_end
        tree_idx = keys - prefix_len
        words = tl.load(Bits + node[:, None] * words_per_row + (tree_idx // 32)[None, :], mask=key_ok[None, :], other=0)
        visible = (((words >> (tree_idx % 32)[None, :]) & 1) != 0) & key_ok[None, :]
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, k_base + keys[:, None] * stride_ks, v_base + keys[:, None] * stride_vs,
            key_ok, visible, qk_scale_log2, DOT_DTYPE, DOT_PRECISION,
        )  # fmt: skip

    out_ptrs = OPart + pid_b * stride_ob + q_head * stride_oh + node * stride_on + split * stride_os
    out = acc / l_i[:, None]
    tl.store(out_ptrs[:, None] + dims[None, :], out.to(OPart.dtype.element_ty), mask=row_ok[:, None])
    if WRITE_LSE:
        lse_row = (pid_b * num_kv_heads * group_size + q_head) * num_nodes + node  # flat (b, q_head, node)
        tl.store(LsePart + lse_row * num_splits + split, m_i + tl.log2(l_i), mask=row_ok)


@_jit
def _merge_splits_kernel(
    OPart, LsePart, Out, num_rows, num_q_heads, num_nodes, num_splits,
    BLOCK_R: tl.constexpr, HEAD_DIM: tl.constexpr,
):  # fmt: skip
    """Merge the split partials of ``BLOCK_R`` flat ``(b, q_head, node)`` rows into ``Out [B, N, Hq, D]``.

    Grid: ``(cdiv(B * Hq * N, BLOCK_R),)``. Reads ``OPart [B, Hq, N, num_splits, D]`` and
    ``LsePart [B, Hq, N, num_splits]`` (contiguous fp32) and weights split ``s`` by ``2^lse_s`` (online).
    """
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < num_rows
    rows = tl.where(row_ok, rows, 0)
    dims = tl.arange(0, HEAD_DIM)

    m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, HEAD_DIM], dtype=tl.float32)
    for split in range(num_splits):
        part = rows * num_splits + split
        lse = tl.load(LsePart + part)
        m_new = tl.maximum(m_i, lse)
        alpha = tl.exp2(m_i - m_new)
        weight = tl.exp2(lse - m_new)
        acc = acc * alpha[:, None] + tl.load(OPart + part[:, None] * HEAD_DIM + dims[None, :]) * weight[:, None]
        l_i = l_i * alpha + weight
        m_i = m_new

    pid_b = rows // (num_q_heads * num_nodes)
    q_head = (rows // num_nodes) % num_q_heads
    node = rows % num_nodes
    out_ptrs = Out + ((pid_b * num_nodes + node) * num_q_heads + q_head) * HEAD_DIM
    out = acc / l_i[:, None]
    tl.store(out_ptrs[:, None] + dims[None, :], out.to(Out.dtype.element_ty), mask=row_ok[:, None])
