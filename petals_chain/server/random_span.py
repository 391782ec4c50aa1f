"""A span of PETALS LLaMA blocks with random weights, built the way PETALS' server builds its blocks.

For the batched step's tests and the ``server-step`` benchmark: no checkpoint, no download, no processes. Each
block is PETALS' ``WrappedLlamaBlock`` from a ``DistributedLlamaConfig``, converted by PETALS' ``convert_block``
(frozen, in a one-device TensorParallel) and served by PETALS' own ``TransformerBackend``; only the memory cache
is a stand-in (:class:`LocalMemoryCache`), because PETALS' ``MemoryCache`` allocates through a pipe between the
connection handlers' processes and the runtime's.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence

import torch

from petals_chain.model_shapes import LlamaShape

TINY = LlamaShape(hidden=64, intermediate=128, heads=4, kv_heads=2, layers=4)
SMOLLM2_ROPE_THETA = 100000.0


def llama_config(shape: LlamaShape, *, rope_theta: float = 10000.0, max_positions: int = 2048):
    """A PETALS ``DistributedLlamaConfig`` of the given shape (no weights)."""
    from petals.models.llama.config import DistributedLlamaConfig

    return DistributedLlamaConfig(
        hidden_size=shape.hidden, intermediate_size=shape.intermediate, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads, num_hidden_layers=shape.layers, vocab_size=128,
        max_position_embeddings=max_positions, rope_theta=rope_theta, torch_dtype="float32",
    )


class LocalMemoryCache:
    """In-process stand-in for PETALS' ``MemoryCache``: handles map to tensors, ``use_cache`` resolves them.

    It offers the one method a ``TransformerBackend`` calls during a step (``use_cache``) and a synchronous
    :meth:`allocate` in place of PETALS' asynchronous, cross-process ``allocate_cache``.
    """

    def __init__(self) -> None:
        self._tensors: dict[int, torch.Tensor] = {}
        self._next = itertools.count()

    def allocate(self, descriptors: Sequence) -> tuple[int, ...]:
        """Zero tensors for ``descriptors`` (hivemind TensorDescriptors); their handles, in order."""
        handles = tuple(next(self._next) for _ in descriptors)
        for handle, descr in zip(handles, descriptors):
            self._tensors[handle] = descr.make_zeros()
        return handles

    def adopt(self, tensors: Sequence[torch.Tensor]) -> tuple[int, ...]:
        """Handles for tensors made elsewhere (e.g. views of an arena), in order."""
        handles = tuple(next(self._next) for _ in tensors)
        self._tensors.update(zip(handles, tensors))
        return handles

    def free(self, handles: Sequence[int]) -> None:
        """Forget the tensors of ``handles``."""
        for handle in handles:
            self._tensors.pop(handle, None)

    @contextlib.contextmanager
    def use_cache(self, *handles: int) -> Iterator[tuple[torch.Tensor, ...]]:
        """The tensors of ``handles``, as PETALS' ``MemoryCache.use_cache`` yields them."""
        yield tuple(self._tensors[h] for h in handles)


def random_backends(config, n_blocks: int, *, seed: int = 0, dtype: torch.dtype = torch.float32,
                    memory_cache: LocalMemoryCache | None = None, max_chunk_size_bytes: int = 256 * 1024 * 1024):
    """``{uid: TransformerBackend}`` for ``n_blocks`` random-weight blocks, built as PETALS' server builds them."""
    from hivemind.utils.tensor_descr import BatchTensorDescriptor
    from petals.server.backend import TransformerBackend
    from petals.utils.convert_block import QuantType, convert_block

    memory_cache = memory_cache if memory_cache is not None else LocalMemoryCache()
    cpu = torch.device("cpu")
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        backends = {}
        for index in range(n_blocks):
            block = config.block_class(config).to(dtype)
            block = convert_block(block, index, config, [cpu], cpu, QuantType.NONE)
            schema = (BatchTensorDescriptor(1, 2048, config.hidden_size, dtype=dtype),)
            uid = f"random.{index}"
            backends[uid] = TransformerBackend(
                uid, block, config=config, memory_cache=memory_cache, backend_dtype=dtype,
                max_chunk_size_bytes=max_chunk_size_bytes, args_schema=schema, kwargs_schema={},
                outputs_schema=schema, min_batch_size=1, max_batch_size=8192,
            )
    finally:
        torch.random.set_rng_state(generator_state)
    return backends


def submit_in_process(backends: dict) -> None:
    """Make every pool of ``backends`` take its tasks through a thread queue: with the handlers and the runtime in
    one process (benchmarks, tests), a future set by the runtime must be the submitter's very object, which
    hivemind's process-crossing queue would copy."""
    import queue

    for backend in backends.values():
        for pool in backend.get_pools():
            pool.submitted_tasks = queue.SimpleQueue()


def allocate_session(backends: dict, batch: int, max_length: int) -> tuple[tuple[int, ...], ...]:
    """Cache handles for one session over every backend (per block, PETALS' keys and values tensors)."""
    memory_cache = next(iter(backends.values())).memory_cache
    return tuple(memory_cache.allocate(b.get_inference_cache_descriptors(batch, max_length)) for b in backends.values())


def inference_infos(backends: dict, handles: Sequence[Sequence[int]], prefix_length: int) -> tuple:
    """The ``InferenceMetadata`` tuple PETALS' handler builds for one session's step on the merged pool."""
    from petals.data_structures import InferenceMetadata

    return tuple(InferenceMetadata(uid, prefix_length, tuple(h), None) for uid, h in zip(backends, handles))
