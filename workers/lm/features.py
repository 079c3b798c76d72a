"""A causal language model's mean hidden state of each example's target text, for the label
gate's unsupervised ceiling (``scripts/label_gate.py``): can k-means on what the base model
reads find the label?

For one example the model reads ``prefix + y_1..y_n`` (``prefix = x``, or ``[BOS]`` when x is
empty, as for b_t in :mod:`workers.lm.surprisal`) and the feature is the mean over the n
positions of y of one layer's hidden state (default the last, after the final norm). Batches
are right-padded with an attention mask and explicit position ids, so a padded row computes
what it computes alone; the body alone runs (``model.base_model``), no logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from workers.lm.surprisal import model_inputs, token_batches


def mean_hidden_states(
    model: Any, x_ids: Sequence[Sequence[int]], y_ids: Sequence[Sequence[int]], *, bos_id: int,
    layer: int = -1, max_batch_tokens: int = 4096, max_batch_size: int = 64,
    progress: bool = True,
) -> np.ndarray:
    """float32 ``[rows, hidden]``: per example, the mean of ``layer``'s hidden state over y.

    Args:
        model: a transformers causal LM in eval mode (its ``base_model`` is called).
        x_ids, y_ids: one list of ids per example; x may be empty, y may not.
        bos_id: the context of examples whose x is empty.
        layer: index into the model's hidden states (0: the embeddings, -1: the last layer).
        max_batch_tokens, max_batch_size: padded tokens and rows per forward pass.
        progress: show a tqdm bar on stderr.

    Raises:
        ModelError: the counts differ, a y is empty, or an id is outside the vocabulary.
    """
    import torch
    from tqdm.auto import tqdm

    inputs = model_inputs(model, x_ids, y_ids, bos_id)
    device = next(model.parameters()).device
    body = model.base_model
    out = np.zeros((len(inputs), int(model.config.hidden_size)), np.float32)
    lengths = [len(ids) for ids in inputs]
    bar = tqdm(total=len(inputs), unit="row", desc="hidden states", disable=not progress)
    with torch.inference_mode():
        for batch in token_batches(lengths, max_batch_tokens, max_batch_size):
            width = max(lengths[i] for i in batch)
            input_ids = torch.zeros(len(batch), width, dtype=torch.long)
            attention = torch.zeros(len(batch), width, dtype=torch.long)
            for r, i in enumerate(batch):
                input_ids[r, :lengths[i]] = torch.tensor(inputs[i])
                attention[r, :lengths[i]] = 1
            positions = torch.arange(width).expand(len(batch), width)
            states = body(input_ids=input_ids.to(device), attention_mask=attention.to(device),
                          position_ids=positions.to(device), output_hidden_states=True,
                          use_cache=False).hidden_states[layer].float().cpu().numpy()
            for r, i in enumerate(batch):
                n_y = len(y_ids[i])
                out[i] = states[r, lengths[i] - n_y:lengths[i]].mean(axis=0)
            bar.update(len(batch))
    bar.close()
    return out
