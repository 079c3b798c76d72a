"""GRU encoder/decoder components shared by the CVAEs and the z-free base model.

Word dropout (Bowman et al. 2016) replaces decoder inputs by UNK: an input-only embedding
row of the decoder (never a vocabulary id, never predicted), so vocabularies, ids and
cached bases stay as they are, and a decoder without word dropout has no such row.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workers.data import PAD_ID


def upcast(tensor: torch.Tensor) -> torch.Tensor:
    """bf16/fp16 -> float32 for losses and softmaxes; float32 and float64 stay as they are."""
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


def reversed_active(tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's leading active run reversed in place (padding stays at the end)."""
    count = mask.sum(dim=-1, keepdim=True)
    position = torch.arange(tokens.shape[-1], device=tokens.device)
    return tokens.gather(-1, torch.where(position < count, count - 1 - position, position))


def state_at_last_active(outputs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``outputs [..., L, H]`` at each row's last active position (the first for an empty row)."""
    # Index arithmetic instead of pack_padded_sequence: no host sync for the lengths.
    last = (mask.sum(dim=-1) - 1).clamp_min(0)
    index = last.view(*last.shape, 1, 1).expand(*last.shape, 1, outputs.shape[-1])
    return outputs.gather(-2, index).squeeze(-2)


class SequenceEncoder(nn.Module):
    """Encodes a padded token sequence to one vector: the GRU state at each row's last token,
    and with ``bidirectional`` also a second GRU's state after reading the row backwards (it
    ends on the first token, which a forward GRU's last state may have forgotten)."""

    def __init__(self, embedding: nn.Embedding, hidden_dim: int, num_layers: int, dropout: float,
                 bidirectional: bool = False):
        super().__init__()
        self.embedding = embedding
        self.dropout = nn.Dropout(dropout)
        self.gru = nn.GRU(
            embedding.embedding_dim, hidden_dim, num_layers=num_layers, batch_first=True,
            dropout=dropout if num_layers > 1 else 0.0,
        )
        self.reverse_gru = nn.GRU(
            embedding.embedding_dim, hidden_dim, num_layers=num_layers, batch_first=True,
            dropout=dropout if num_layers > 1 else 0.0,
        ) if bidirectional else None

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """``tokens [B, L]`` -> ``[B, H]`` (``[B, 2H]`` bidirectional). With ``mask`` (a leading run
        per row), the state at the last active position; rows without an active token get the
        state after the first token."""
        outputs, _ = self.gru(self.dropout(self.embedding(tokens)))
        if mask is None:
            return outputs[:, -1]
        state = state_at_last_active(outputs, mask)
        if self.reverse_gru is None:
            return state
        backwards, _ = self.reverse_gru(self.dropout(self.embedding(reversed_active(tokens, mask))))
        return torch.cat([state, state_at_last_active(backwards, mask)], dim=-1)


def nll_at_tokens(hidden: torch.Tensor, target: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor) -> torch.Tensor:
    """Per-position NLL ``[K, N]`` of ``target [K, N]`` under K output layers (``weight [K, V, H]``,
    ``bias [K, V]``) on ``hidden [K, N, H]``, 0 at PAD, with the vocabulary's logits computed only
    at the positions where some row holds a token.

    The values are ``cross_entropy(hidden @ weight.T + bias, target, ignore_index=PAD)``'s; a
    padded batch is often half PAD, and the output layer is most of an evaluation's cost. The
    positions are found on the host, once for all K (a sync): for evaluation, not a training step.
    """
    positions = (target != PAD_ID).any(0).nonzero().squeeze(1)
    chosen = target.index_select(1, positions)
    logits = torch.baddbmm(bias.unsqueeze(1), hidden.index_select(1, positions), weight.transpose(1, 2))
    values = F.cross_entropy(upcast(logits).reshape(-1, logits.shape[-1]), chosen.reshape(-1),
                             reduction="none", ignore_index=PAD_ID).view_as(chosen)
    return values.new_zeros(target.shape).index_copy_(1, positions, values)


def word_dropout_mask(shape: torch.Size | tuple[int, ...], rate: float, device: torch.device,
                      generator: torch.Generator | None = None) -> torch.Tensor:
    """Which decoder inputs ``[B, T]`` become UNK: each with probability ``rate``, never position
    0 (BOS). One float32 uniform draw per position, from ``generator`` (None: torch's global
    one), so a cohort member drawing from its own stream reproduces its lone trial."""
    dropped = torch.rand(shape, dtype=torch.float32, device=device, generator=generator) < rate
    dropped[:, 0] = False
    return dropped


class ConditionalDecoder(nn.Module):
    """Autoregressive GRU decoder of y given a conditioning vector (context, and z if any).

    The conditioning vector initialises the hidden state and is also fed at every step,
    so the decoder cannot forget z over long sequences. With ``unk_input``, the decoder has
    ``unk_embedding``, the input embedding of a dropped word (zeros at initialisation: no
    token, and no draw from the RNG).
    """

    def __init__(
        self, embedding: nn.Embedding, condition_dim: int, hidden_dim: int, num_layers: int,
        dropout: float, unk_input: bool = False,
    ):
        super().__init__()
        self.embedding = embedding
        self.num_layers = num_layers
        self.dropout = nn.Dropout(dropout)
        self.init_state = nn.Linear(condition_dim, hidden_dim * num_layers)
        self.gru = nn.GRU(
            embedding.embedding_dim + condition_dim, hidden_dim, num_layers=num_layers,
            batch_first=True, dropout=dropout if num_layers > 1 else 0.0,
        )
        self.output = nn.Linear(hidden_dim, embedding.num_embeddings)
        self.unk_embedding = nn.Parameter(torch.zeros(embedding.embedding_dim)) if unk_input else None

    def embed(self, decoder_input: torch.Tensor, dropped: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, T]`` -> ``[B, T, E]``; positions where ``dropped [B, T]`` is True read UNK."""
        embedded = self.embedding(decoder_input)
        if dropped is None:
            return embedded
        if self.unk_embedding is None:
            raise ValueError("word dropout needs a decoder built with unk_input=True")
        unk = self.unk_embedding.to(embedded.dtype)
        return torch.where(dropped.unsqueeze(-1), unk, embedded)

    def logits(self, decoder_input: torch.Tensor, condition: torch.Tensor,
               dropped: torch.Tensor | None = None) -> torch.Tensor:
        """``decoder_input [B, T]`` (BOS + y shifted right), ``condition [B, C]`` -> ``[B, T, V]``;
        ``dropped [B, T]``: the inputs replaced by UNK (word dropout), None for none."""
        return self.output(self.hidden_states(decoder_input, condition, dropped))

    def hidden_states(self, decoder_input: torch.Tensor, condition: torch.Tensor,
                      dropped: torch.Tensor | None = None) -> torch.Tensor:
        """What :meth:`logits` projects onto the vocabulary: ``[B, T, H]``, after dropout."""
        batch, length = decoder_input.shape
        state = torch.tanh(self.init_state(condition)).view(batch, self.num_layers, -1)
        state = state.transpose(0, 1).contiguous()
        steps = condition.unsqueeze(1).expand(batch, length, condition.shape[-1])
        inputs = torch.cat([self.dropout(self.embed(decoder_input, dropped)), steps], dim=-1)
        outputs, _ = self.gru(inputs, state)
        return self.dropout(outputs)

    def token_nll(
        self, decoder_input: torch.Tensor, target: torch.Tensor, condition: torch.Tensor,
        dropped: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Per-token NLL ``[B, T]`` of ``target`` (0 at PAD positions), in float32."""
        if not torch.is_grad_enabled():  # evaluation: the vocabulary's logits only where a token is
            outputs = self.hidden_states(decoder_input, condition, dropped)
            return nll_at_tokens(outputs.reshape(1, target.numel(), -1), target.reshape(1, -1),
                                 self.output.weight.unsqueeze(0), self.output.bias.unsqueeze(0)).view_as(target)
        logits = self.logits(decoder_input, condition, dropped)
        nll = F.cross_entropy(
            upcast(logits).reshape(-1, logits.shape[-1]), target.reshape(-1), reduction="none",
            ignore_index=PAD_ID,
        )
        return nll.view_as(target)
