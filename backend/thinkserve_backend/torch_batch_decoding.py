"""The torch target's batched decoder: many sequences advanced by one forward pass, each at its own position.

What in-flight batching (inflight_batching.py) runs. The KV cache is one preallocated block of `slots` sequences
(SlotKVCache: per layer keys and values [slots, kv_heads, capacity, head_dim]); the running sequences always
occupy rows 0..n-1, so one decode step attends over a view of the cache (no gather, no copy) bounded by the
longest running sequence. A sequence that ends frees its row by moving the last running row into it (one
sequence's cache copied, once). Each row has its own position: rotary positions and the attention mask are per
row, and the mask is handed to the model ready made (a 4-D additive mask transformers uses as it is).

New sequences are prefilled together (right-padded to the longest prompt; the mask keeps padding out of every
real position, and a padded position's keys are overwritten by the row's own later tokens before any real query
may see them). The next token of every row is chosen where the logits lie, in one pass for the greedy rows
(choose_tokens); three numbers per row reach the host.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, Sequence

import numpy as np
import torch

from .sampling import RowSampling, TokenChoice
from .torch_decode_attention import use_grouped_decode_attention, use_sdpa_attention
from .torch_decode_graphs import BucketedSteps, DecodeGraphs
from .torch_decoding import DeviceLogits
from .torch_modules import GeneratorModules


def kv_shape(text_config) -> tuple[int, int, int]:
    """(layers, kv heads, head dim) of a causal LM's attention, from its text config."""
    heads = text_config.num_attention_heads
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // heads
    return text_config.num_hidden_layers, getattr(text_config, "num_key_value_heads", None) or heads, head_dim


def kv_bytes_per_token(text_config, dtype: torch.dtype) -> int:
    """Bytes of keys and values one token occupies in the cache (all layers)."""
    layers, kv_heads, head_dim = kv_shape(text_config)
    return 2 * layers * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


class SlotKVCache:
    """Keys and values of up to `slots` sequences of up to `capacity` positions, allocated once (zeros: a masked
    position is never NaN). The model's attention layers call `update`; where it writes is set per forward."""

    def __init__(self, text_config, slots: int, capacity: int, device: torch.device, dtype: torch.dtype):
        layers, kv_heads, head_dim = kv_shape(text_config)
        shape = (slots, kv_heads, capacity, head_dim)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(layers)]
        self.slots, self.capacity = slots, capacity
        self._write: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = None

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, cache_kwargs=None):
        """transformers' Cache.update: store this step's keys and values, return what the layer attends over."""
        return self._write(self.keys[layer_idx], key_states), self._write(self.values[layer_idx], value_states)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # positions are always given explicitly; nothing asks the cache for them

    def writing_decode(self, positions: torch.Tensor, length: int) -> None:
        """The next forward: one new token for each of rows 0..n-1, row i at positions[i]; attend over `length`."""
        rows = torch.arange(len(positions), device=positions.device)

        def write(buffer: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
            buffer[rows, :, positions] = new[:, :, 0]
            return buffer[: len(positions), :, :length]

        self._write = write

    def writing_prefill(self, first_row: int, rows: int, length: int) -> None:
        """The next forward: prompts (right-padded to `length`) into rows first_row.. first_row + rows - 1."""

        def write(buffer: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
            buffer[first_row : first_row + rows, :, :length] = new
            return buffer[first_row : first_row + rows, :, :length]

        self._write = write

    def move_row(self, source: int, target: int, length: int) -> None:
        """Row `source`'s first `length` positions into row `target` (a finished sequence's row is reused)."""
        for buffer in self.keys + self.values:
            buffer[target, :, :length] = buffer[source, :, :length]


class BatchDecoder:
    """One causal LM and its slot cache: prefill new rows, advance every running row by one token."""

    def __init__(self, modules: GeneratorModules, slots: int, capacity: int, device: torch.device, dtype: torch.dtype,
                 grouped_attention: bool = True):
        self.modules = modules
        self.device, self.dtype = device, dtype
        self.takes_embeddings = modules.embeddings is not None
        self.vocab_size = int(modules.lm_head.out_features)
        self.cache = SlotKVCache(modules.text_config, slots, capacity, device, dtype)
        self._min = torch.finfo(dtype).min
        self._steps: Optional[BucketedSteps] = None  # None: each step eagerly at its exact shapes
        # grouped query heads folded onto their key/value head in a decode step ("" when on, else why not)
        self.no_grouped_attention_reason = (use_grouped_decode_attention(modules.text_config) if grouped_attention
                                            else "the grouped_decode_attention parameter is off")

    @property
    def slots(self) -> int:
        return self.cache.slots

    def _embedded(self, inputs) -> torch.Tensor:
        """A prompt as the backbone's input rows: ids [n] / [1, n] as int64, embeddings [1, n, d] in the model's dtype."""
        tensor = torch.as_tensor(np.ascontiguousarray(inputs) if isinstance(inputs, np.ndarray) else inputs)
        tensor = tensor.to(self.device)
        return tensor.to(self.dtype) if tensor.is_floating_point() else tensor.long()

    @torch.inference_mode()
    def prefill(self, first_row: int, prompts: Sequence) -> torch.Tensor:
        """Run each prompt (ids [1, n] or embeddings [1, n, d]) into rows first_row, first_row + 1, ...; the next-token
        logits of each [k, vocab] (float32, on the model's device)."""
        tensors = [self._embedded(p) for p in prompts]
        lengths = [t.shape[1] for t in tensors]
        length = max(lengths)
        if length > self.cache.capacity:
            raise ValueError(f"a prompt of {length} positions exceeds the cache's {self.cache.capacity}")
        batch = torch.zeros((len(tensors), length, *tensors[0].shape[2:]), dtype=tensors[0].dtype, device=self.device)
        for row, tensor in enumerate(tensors):
            batch[row, : tensor.shape[1]] = tensor[0]
        ends = torch.tensor(lengths, device=self.device)
        steps = torch.arange(length, device=self.device)
        visible = (steps[None, None, :] <= steps[None, :, None]) & (steps[None, None, :] < ends[:, None, None])
        mask = torch.zeros(visible.shape, dtype=self.dtype, device=self.device).masked_fill_(~visible, self._min)
        self.cache.writing_prefill(first_row, len(tensors), length)
        hidden = self._forward(batch, steps[None].expand(len(tensors), length), mask[:, None])
        return self.modules.lm_head(hidden[torch.arange(len(tensors), device=self.device), ends - 1]).float()

    @torch.inference_mode()
    def decode(self, token_ids: Sequence[int], positions: Sequence[int]) -> torch.Tensor:
        """One token for each running row 0..n-1 (row i's last token at positions[i]); the next logits [n, vocab]."""
        if self._steps is not None:  # bucketed shapes: CUDA graphs replayed, or (tests) the same shapes eagerly
            return self._steps(token_ids, positions)
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        where = torch.tensor(positions, dtype=torch.long, device=self.device)
        return self._step(ids, where, max(positions) + 1)

    def _step(self, ids: torch.Tensor, where: torch.Tensor, length: int) -> torch.Tensor:
        """The decode step on device tensors alone (ids [n], positions [n]; attends over `length` positions): what a
        CUDA graph captures, so nothing here reads a value back to the host."""
        inputs = self.modules.embeddings(ids[:, None]).to(self.dtype) if self.takes_embeddings else ids[:, None]
        visible = torch.arange(length, device=self.device)[None, :] <= where[:, None]
        mask = torch.zeros(visible.shape, dtype=self.dtype, device=self.device).masked_fill_(~visible, self._min)
        self.cache.writing_decode(where, length)
        hidden = self._forward(inputs, where[:, None], mask[:, None, None])
        return self.modules.lm_head(hidden[:, -1]).float()

    @property
    def decode_mode(self) -> str:
        """How a decode step runs: "cuda graphs (N)", "bucketed" (eagerly, at the graphs' shapes) or "eager"."""
        if isinstance(self._steps, DecodeGraphs):
            return f"cuda graphs ({len(self._steps)})"
        return "bucketed" if self._steps is not None else "eager"

    @contextmanager
    def eager_steps(self) -> Iterator[None]:
        """Within: every decode step eagerly at its exact shapes (to time the CUDA graphs against), then as before.
        Only while no generation runs: the in-flight batcher's thread owns the decoder otherwise."""
        steps, self._steps = self._steps, None
        try:
            yield
        finally:
            self._steps = steps

    @torch.inference_mode()
    def use_bucketed_steps(self, min_length: int = 256) -> None:
        """Decode at the shapes the CUDA graphs use, eagerly (on the CPU, where there are no graphs: the tests)."""
        self._steps = BucketedSteps(self._step, self.slots, self.cache.capacity, self.device, min_length)

    @torch.inference_mode()
    def use_cuda_graphs(self, min_length: int = 256) -> str:
        """Capture the decode step's graphs and check their logits against whole sequences (self_check); on any
        failure keep the eager step. Returns "" when the graphs serve, else why not (for the model's log)."""
        if self.device.type != "cuda":
            return f"no CUDA graphs on {self.device.type}"
        graphs = DecodeGraphs(self._step, self.slots, self.cache.capacity, self.device, min_length)
        try:
            graphs.capture()
        except Exception as error:  # e.g. a forward that reads a value back to the host: not capturable
            self._clear_cache()
            return f"capturing the decode step failed ({type(error).__name__}: {error})"
        self._clear_cache()
        self._steps = graphs
        try:
            self.self_check()
        except RuntimeError as error:
            self._steps = None
            return f"the replayed decode step failed its check ({error})"
        return ""

    def _forward(self, inputs: torch.Tensor, position_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        primary = {"inputs_embeds": inputs} if inputs.is_floating_point() else {"input_ids": inputs}
        output = self.modules.backbone(
            **primary, attention_mask=mask, position_ids=position_ids, past_key_values=self.cache, use_cache=True,
        )
        return output.last_hidden_state

    @torch.inference_mode()
    def self_check(self) -> None:
        """Two rows of different lengths prefilled together, then one decode step each, against the same token
        sequences run whole without a cache: raises if the logits disagree (an attention implementation or a
        transformers version that ignores the cache or the per-row mask this decoder hands it). When the grouped
        decode attention serves and the check fails, it is checked once more with transformers' sdpa path, which
        then serves (`no_grouped_attention_reason` says why): batching is not given up for the attention alone."""
        try:
            self._compare_with_whole_sequences()
        except Exception as error:
            if self.no_grouped_attention_reason:
                raise RuntimeError(f"the batch decoder's check at load failed: {error}") from error
            self._clear_cache()
            use_sdpa_attention(self.modules.text_config)
            self.no_grouped_attention_reason = f"the grouped decode attention failed the check at load ({error})"
            self.self_check()
        finally:
            self._clear_cache()

    def _clear_cache(self) -> None:
        for buffer in self.cache.keys + self.cache.values:
            buffer.zero_()

    def _compare_with_whole_sequences(self) -> None:
        sequences = ([3, 5, 7], [11, 13, 17, 19, 23])[: self.slots]  # two rows of different lengths where there are two
        following = (29, 31)

        def primary(ids: list[int]):
            tokens = torch.tensor([ids], device=self.device)
            return self.modules.embeddings(tokens).to(self.dtype) if self.takes_embeddings else tokens

        first = self.prefill(0, [primary(ids) for ids in sequences])
        then = self.decode(list(following[: len(sequences)]), [len(ids) for ids in sequences])
        tolerance = 1e-3 if self.dtype == torch.float32 else 5e-2
        for row, ids in enumerate(sequences):
            for logits, sequence in ((first[row], ids), (then[row], ids + [following[row]])):
                inputs = primary(sequence)
                named = {"inputs_embeds": inputs} if inputs.is_floating_point() else {"input_ids": inputs}
                whole = self.modules.backbone(**named, use_cache=False).last_hidden_state[0, -1]
                expected = self.modules.lm_head(whole).float()
                scale = float(expected.abs().max()) or 1.0
                difference = float((logits - expected).abs().max())
                if difference > tolerance * scale:
                    raise RuntimeError(
                        f"batched logits differ from the whole sequence's by {difference:.3g} (scale {scale:.3g}) at row {row}"
                    )

    def choose(self, logits: torch.Tensor, rows: Sequence[RowSampling]) -> list[TokenChoice]:
        return choose_tokens(logits, rows)

    def move_row(self, source: int, target: int, length: int) -> None:
        with torch.inference_mode():
            self.cache.move_row(source, target, length)


@torch.inference_mode()
def choose_tokens(logits: torch.Tensor, rows: Sequence[RowSampling]) -> list[TokenChoice]:
    """Each row's token with its log-probability and entropy, as sampling.choose_token (and DeviceLogits) choose
    them: the greedy rows in one pass over the batch, a sampled row from its own uniform draw."""
    wide = logits.double()
    log_probs = torch.log_softmax(wide, dim=-1)
    entropy = (-(log_probs.exp() * log_probs).sum(dim=-1) / math.log(logits.shape[-1])).clamp(0.0, 1.0)
    tokens = torch.argmax(wide, dim=-1)
    for index, row in enumerate(rows):
        if row.temperature > 0:
            probs = torch.softmax(wide[index] / row.temperature, dim=-1)
            tokens[index] = DeviceLogits._sample(probs, row.top_p, row.uniform)
    chosen = log_probs.gather(1, tokens[:, None])[:, 0]
    measures = torch.stack([tokens.double(), chosen, entropy], dim=1).cpu().numpy()
    return [TokenChoice(int(t), float(lp), float(h)) for t, lp, h in measures]
