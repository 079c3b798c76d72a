"""Conditional VAEs over token sequences with a discrete or a continuous latent.

q(z | x, y) reads the context and the target; p(z | x) reads the context (or is
standard); the decoder p(y | x, z) returns per-token NLL [B, T] for the objective
library. Losses are composed only by the loss stack, never here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from workers.models.backbone import ConditionalDecoder, SequenceEncoder, upcast, word_dropout_mask
from workers.models.config import ModelConfig

INFERENCE_PARAMS = ("target_encoder.", "posterior_head.")
"""Name prefixes of the parameters only q(z | x, y) reads (the inference network); the shared
embedding and context encoder also feed the decoder and the prior."""


@dataclass
class CVAEOutput:
    """What one forward pass returns.

    Attributes:
        token_nll: ``[B, T]`` decoder NLL per token; for exact enumeration, the expectation
            over q(z | x, y) (every loss term is linear in the token losses, so this is exact).
        kl: ``[B]`` (discrete) or ``[B, D]`` (continuous, per dimension) KL(q(z|x,y) || p(z|x)).
        bow_logits: ``[B, V]`` bag-of-words logits from (x, z) (z = posterior-mean embedding
            when enumerating).
        posterior_probs: ``[B, K]`` q(z | x, y) for the discrete family, else None.
        posterior_mean, posterior_logvar: ``[B, D]`` for the continuous family, else None.
    """

    token_nll: torch.Tensor
    kl: torch.Tensor
    bow_logits: torch.Tensor
    posterior_probs: torch.Tensor | None = None
    posterior_mean: torch.Tensor | None = None
    posterior_logvar: torch.Tensor | None = None


class CVAE(nn.Module):
    """A GRU CVAE; ``config.family`` picks the latent. ``total_steps``: the trial's optimizer
    steps, which ``gumbel_anneal_fraction`` resolves against."""

    def __init__(self, config: ModelConfig, vocab_size: int, num_strategies: int,
                 total_steps: int | None = None):
        super().__init__()
        self.config = config
        self.gumbel_decay_steps = config.gumbel_decay_steps(total_steps)
        self.family = config.family
        self.num_categories = config.num_categories or num_strategies
        hidden, latent = config.hidden_dim, config.latent_dim
        self.embedding = nn.Embedding(vocab_size, config.embedding_dim)
        self.context_encoder = SequenceEncoder(self.embedding, hidden, config.num_layers, config.dropout)
        bidirectional = config.target_encoder == "bidirectional"
        self.target_encoder = SequenceEncoder(self.embedding, hidden, config.num_layers, config.dropout,
                                              bidirectional)
        posterior_width = (3 if bidirectional else 2) * hidden  # [context; target (both ways)]
        if self.family == "discrete":
            self.posterior_head = nn.Linear(posterior_width, self.num_categories)
            self.prior_head = nn.Linear(hidden, self.num_categories)
            self.latent_embedding = nn.Embedding(self.num_categories, latent)
        else:
            self.posterior_head = nn.Linear(posterior_width, 2 * latent)
            self.prior_head = nn.Linear(hidden, 2 * latent)
        self.decoder = ConditionalDecoder(
            self.embedding, hidden + latent, hidden, config.num_layers, config.dropout,
            unk_input=config.word_dropout > 0,
        )
        self.bow_head = nn.Sequential(nn.Linear(hidden + latent, hidden), nn.Tanh(),
                                      nn.Linear(hidden, vocab_size))
        self.step = 0  # optimisation steps seen, for the Gumbel temperature schedule

    def gumbel_temperature(self) -> float:
        """Exponentially annealed temperature at the current step."""
        c = self.config
        progress = min(1.0, self.step / self.gumbel_decay_steps)
        return c.gumbel_temperature_start * (c.gumbel_temperature_end / c.gumbel_temperature_start) ** progress

    def forward(
        self,
        context: torch.Tensor,
        decoder_input: torch.Tensor,
        target: torch.Tensor,
        mask: torch.Tensor,
    ) -> CVAEOutput:
        """Run q(z|x,y), p(z|x) and the decoder on a batch (see CVAEOutput).

        In training with ``word_dropout`` > 0, the dropped decoder inputs are drawn first, from
        torch's global RNG (before z's noise): the cohort draws in the same order."""
        dropped = None
        if self.training and self.config.word_dropout > 0:
            dropped = word_dropout_mask(decoder_input.shape, self.config.word_dropout, decoder_input.device)
        h_context = self.context_encoder(context)
        h_target = self.target_encoder(target, mask)
        posterior_input = torch.cat([h_context, h_target], dim=-1)
        if self.family == "discrete":
            return self._discrete(h_context, posterior_input, decoder_input, target, dropped)
        return self._continuous(h_context, posterior_input, decoder_input, target, dropped)

    def _discrete(self, h_context, posterior_input, decoder_input, target, dropped) -> CVAEOutput:
        q_logits = upcast(self.posterior_head(posterior_input))
        log_q = F.log_softmax(q_logits, dim=-1)
        if self.config.prior == "learned":
            log_p = F.log_softmax(upcast(self.prior_head(h_context)), dim=-1)
        else:
            log_p = torch.full_like(log_q, -math.log(self.num_categories))
        q = log_q.exp()
        kl = (q * (log_q - log_p)).sum(dim=-1)
        batch, k = q.shape
        if self.config.discrete_estimator == "enumerate" or not self.training:
            # Exact E_q[l_t]: decode every category in one batch of B*K rows.
            z = self.latent_embedding.weight.to(h_context.dtype)
            condition = torch.cat(
                [h_context.unsqueeze(1).expand(batch, k, -1), z.unsqueeze(0).expand(batch, k, -1)],
                dim=-1,
            ).reshape(batch * k, -1)
            repeat = lambda t: t.unsqueeze(1).expand(batch, k, t.shape[-1]).reshape(batch * k, -1)  # noqa: E731
            nll = self.decoder.token_nll(repeat(decoder_input), repeat(target), condition,
                                         None if dropped is None else repeat(dropped))
            token_nll = (q.unsqueeze(-1) * nll.view(batch, k, -1)).sum(dim=1)
            z_mean = q.to(z.dtype) @ z
        else:
            sample = F.gumbel_softmax(q_logits, tau=self.gumbel_temperature(), hard=True)
            z_mean = sample.to(h_context.dtype) @ self.latent_embedding.weight.to(h_context.dtype)
            token_nll = self.decoder.token_nll(
                decoder_input, target, torch.cat([h_context, z_mean], dim=-1), dropped
            )
        bow = upcast(self.bow_head(torch.cat([h_context, z_mean], dim=-1)))
        return CVAEOutput(token_nll, kl, bow, posterior_probs=q)

    def _continuous(self, h_context, posterior_input, decoder_input, target, dropped) -> CVAEOutput:
        mean, logvar = upcast(self.posterior_head(posterior_input)).chunk(2, dim=-1)
        if self.config.prior == "learned":
            prior_mean, prior_logvar = upcast(self.prior_head(h_context)).chunk(2, dim=-1)
        else:
            prior_mean, prior_logvar = torch.zeros_like(mean), torch.zeros_like(logvar)
        kl = 0.5 * (
            prior_logvar - logvar + (logvar.exp() + (mean - prior_mean) ** 2) / prior_logvar.exp() - 1.0
        )
        z = mean + torch.randn_like(mean) * (0.5 * logvar).exp() if self.training else mean
        condition = torch.cat([h_context, z.to(h_context.dtype)], dim=-1)
        token_nll = self.decoder.token_nll(decoder_input, target, condition, dropped)
        bow = upcast(self.bow_head(condition))
        return CVAEOutput(token_nll, kl, bow, posterior_mean=mean, posterior_logvar=logvar)


class BaseDecoder(nn.Module):
    """The z-free autoregressive base model p_base(y | x): the CVAE decoder without z."""

    def __init__(self, config: ModelConfig, vocab_size: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, config.embedding_dim)
        self.context_encoder = SequenceEncoder(
            self.embedding, config.hidden_dim, config.num_layers, config.dropout
        )
        self.decoder = ConditionalDecoder(
            self.embedding, config.hidden_dim, config.hidden_dim, config.num_layers, config.dropout
        )

    def forward(self, context: torch.Tensor, decoder_input: torch.Tensor, target: torch.Tensor):
        """Per-token NLL ``[B, T]`` of ``target`` given the context only."""
        return self.decoder.token_nll(decoder_input, target, self.context_encoder(context))
