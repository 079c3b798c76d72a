"""The CVAE's training-mode forward pass for K stacked parameter sets at once.

A cohort keeps its members' parameters stacked on a leading axis and runs this forward once per
step for all of them: every matmul one batched ``baddbmm``, the GRUs unrolled with one batched
step per position. The maths is ``workers/models/cvae.py``'s op for op, so member k's slice
equals ``CVAE.forward`` of member k's parameters up to float rounding. Randomness is an argument
(``noise``, ``dropped``) drawn from each member's own generator, as its lone trial would draw it;
dropout is not supported (the cohort refuses ``dropout > 0``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from workers.data import PAD_ID
from workers.models.backbone import nll_at_tokens, reversed_active, state_at_last_active, upcast
from workers.models.config import ModelConfig

Params = dict[str, torch.Tensor]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x [K, ..., in]``, ``weight [K, out, in]``, ``bias [K, out]`` -> ``[K, ..., out]``."""
    members = x.shape[0]
    flat = x.reshape(members, -1, x.shape[-1])
    if bias is None:
        out = torch.bmm(flat, weight.transpose(1, 2))
    else:
        out = torch.baddbmm(bias.unsqueeze(1), flat, weight.transpose(1, 2))
    return out.reshape(*x.shape[:-1], weight.shape[1])


def embed(weight: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``weight [K, V, E]``, ``tokens [K, ...]`` -> ``[K, ..., E]`` (one table per member)."""
    members, vocab, width = weight.shape
    offsets = torch.arange(members, device=tokens.device).view(-1, *([1] * (tokens.dim() - 1)))
    return F.embedding(tokens + offsets * vocab, weight.reshape(members * vocab, width))


def gru(params: Params, prefix: str, inputs: torch.Tensor | None, num_layers: int,
        state: torch.Tensor | None = None, gates: torch.Tensor | None = None) -> torch.Tensor:
    """An ``nn.GRU(batch_first=True)`` over ``inputs [K, B, L, E]``; returns outputs ``[K, B, L, H]``.

    ``state [K, num_layers, B, H]`` is the initial hidden state (zeros when None). ``gates``:
    the first layer's input projection ``W_ih x + b_ih`` ``[K, B, L, 3H]``, when the caller
    computed it (then ``inputs`` is unused).
    """
    outputs = inputs
    for layer in range(num_layers):
        w_hh = params[f"{prefix}.weight_hh_l{layer}"]
        b_hh = params[f"{prefix}.bias_hh_l{layer}"].unsqueeze(1)
        gates_x = gates if layer == 0 and gates is not None else linear(
            outputs, params[f"{prefix}.weight_ih_l{layer}"], params[f"{prefix}.bias_ih_l{layer}"])
        members, batch = gates_x.shape[:2]
        h = gates_x.new_zeros(members, batch, w_hh.shape[-1]) if state is None else state[:, layer]
        w_hh_t = w_hh.transpose(1, 2)
        steps = []
        for gates_t in gates_x.unbind(2):  # unbind, not slicing: its backward is one stack
            x_r, x_z, x_n = gates_t.chunk(3, dim=-1)
            h_r, h_z, h_n = torch.baddbmm(b_hh, h, w_hh_t).chunk(3, dim=-1)
            reset = torch.sigmoid(x_r + h_r)
            update = torch.sigmoid(x_z + h_z)
            candidate = torch.tanh(x_n + reset * h_n)
            h = (1 - update) * candidate + update * h
            steps.append(h)
        outputs = torch.stack(steps, dim=2)
    return outputs


def encode(params: Params, prefix: str, config: ModelConfig, tokens: torch.Tensor,
           mask: torch.Tensor | None = None) -> torch.Tensor:
    """``SequenceEncoder.forward``: ``tokens [K, B, L]`` -> ``[K, B, H]`` (``2H`` with a reverse GRU)."""
    outputs = gru(params, f"{prefix}.gru", embed(params["embedding.weight"], tokens), config.num_layers)
    if mask is None:
        return outputs[:, :, -1]
    state = state_at_last_active(outputs, mask)
    if f"{prefix}.reverse_gru.weight_hh_l0" not in params:
        return state
    backwards = gru(params, f"{prefix}.reverse_gru",
                    embed(params["embedding.weight"], reversed_active(tokens, mask)), config.num_layers)
    return torch.cat([state, state_at_last_active(backwards, mask)], dim=-1)


def token_nll(params: Params, config: ModelConfig, decoder_input: torch.Tensor,
              target: torch.Tensor, condition: torch.Tensor,
              dropped: torch.Tensor | None = None) -> torch.Tensor:
    """``ConditionalDecoder.token_nll``: per-token NLL ``[K, B, T]`` (0 at PAD).

    ``condition [K, B, C]``, or ``[K, B, R, C]`` for R conditions per row (each z category
    when enumerating; then ``[K, B, R, T]``). The GRU's input projection of
    ``[embedding; condition]`` is split in two, so the tokens are projected once per row
    and the condition once per sequence, not once per position and category. ``dropped
    [K, B, T]``: the inputs that read ``decoder.unk_embedding`` (word dropout).
    """
    single = condition.dim() == 3
    if single:
        condition = condition.unsqueeze(2)
    members, batch, repeats, _ = condition.shape
    length, layers = decoder_input.shape[-1], config.num_layers
    flat = condition.reshape(members, batch * repeats, -1)
    state = torch.tanh(linear(flat, params["decoder.init_state.weight"], params["decoder.init_state.bias"]))
    state = state.view(members, batch * repeats, layers, -1).transpose(1, 2)
    w_ih, width = params["decoder.gru.weight_ih_l0"], params["embedding.weight"].shape[-1]
    embedded = embed(params["embedding.weight"], decoder_input)
    if dropped is not None:
        unk = params["decoder.unk_embedding"].to(embedded.dtype).view(members, 1, 1, width)
        embedded = torch.where(dropped.unsqueeze(-1), unk, embedded)
    x_tokens = linear(embedded, w_ih[..., :width], params["decoder.gru.bias_ih_l0"])
    x_condition = linear(condition, w_ih[..., width:], None)
    gates = (x_tokens.unsqueeze(2) + x_condition.unsqueeze(3)).reshape(members, batch * repeats, length, -1)
    outputs = gru(params, "decoder.gru", None, layers, state, gates)
    targets = target.unsqueeze(2).expand(members, batch, repeats, length)
    weight, bias = params["decoder.output.weight"], params["decoder.output.bias"]
    if torch.is_grad_enabled():
        logits = linear(outputs, weight, bias)
        nll = F.cross_entropy(upcast(logits).reshape(-1, logits.shape[-1]), targets.reshape(-1),
                              reduction="none", ignore_index=PAD_ID)
    else:  # evaluation: the vocabulary's logits only where a token is
        nll = nll_at_tokens(outputs.reshape(members, -1, outputs.shape[-1]), targets.reshape(members, -1),
                            weight, bias)
    nll = nll.view(members, batch, repeats, length)
    return nll.squeeze(2) if single else nll


def _head(params: Params, name: str, x: torch.Tensor) -> torch.Tensor:
    return upcast(linear(x, params[f"{name}.weight"], params[f"{name}.bias"]))


def _bow(params: Params, condition: torch.Tensor) -> torch.Tensor:
    hidden = torch.tanh(linear(condition, params["bow_head.0.weight"], params["bow_head.0.bias"]))
    return upcast(linear(hidden, params["bow_head.2.weight"], params["bow_head.2.bias"]))


def cvae_forward(params: Params, config: ModelConfig, num_categories: int, context: torch.Tensor,
                 decoder_input: torch.Tensor, target: torch.Tensor, mask: torch.Tensor,
                 noise: torch.Tensor | None = None, temperature: float = 1.0,
                 training: bool = True, dropped: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """``CVAE.forward`` of K members; every input has a leading K axis.

    ``noise``: the continuous family's standard normal draws ``[K, B, D]``; the Gumbel
    estimator's ``-log(Exponential)`` draws ``[K, B, categories]``; None when enumerating or
    when ``training`` is False (the eval-mode forward: z is the posterior mean, the discrete
    family enumerates whatever its estimator). ``dropped [K, B, T]``: the decoder inputs word
    dropout replaces by UNK (``backbone.word_dropout_mask`` per member), None for none; it is
    ignored when ``training`` is False, as the module never drops at evaluation. Returns ``token_nll [K, B, T]``, ``kl [K, B]``
    or ``[K, B, D]``, ``bow_logits [K, B, V]``, and the posterior: ``posterior_probs [K, B, C]``
    (discrete) or ``posterior_mean`` and ``posterior_logvar [K, B, D]`` (continuous).
    """
    dropped = dropped if training else None
    h_context = encode(params, "context_encoder", config, context)
    h_target = encode(params, "target_encoder", config, target, mask)
    posterior_input = torch.cat([h_context, h_target], dim=-1)
    if config.family == "continuous":
        mean, logvar = _head(params, "posterior_head", posterior_input).chunk(2, dim=-1)
        if config.prior == "learned":
            prior_mean, prior_logvar = _head(params, "prior_head", h_context).chunk(2, dim=-1)
        else:
            prior_mean, prior_logvar = torch.zeros_like(mean), torch.zeros_like(logvar)
        kl = 0.5 * (prior_logvar - logvar
                    + (logvar.exp() + (mean - prior_mean) ** 2) / prior_logvar.exp() - 1.0)
        z = mean + noise * (0.5 * logvar).exp() if training else mean
        condition = torch.cat([h_context, z.to(h_context.dtype)], dim=-1)
        nll = token_nll(params, config, decoder_input, target, condition, dropped)
        return {"token_nll": nll, "kl": kl, "bow_logits": _bow(params, condition),
                "posterior_mean": mean, "posterior_logvar": logvar}
    q_logits = _head(params, "posterior_head", posterior_input)
    log_q = F.log_softmax(q_logits, dim=-1)
    if config.prior == "learned":
        log_p = F.log_softmax(_head(params, "prior_head", h_context), dim=-1)
    else:
        log_p = torch.full_like(log_q, -math.log(num_categories))
    q = log_q.exp()
    kl = (q * (log_q - log_p)).sum(dim=-1)
    members, batch, k = q.shape
    latent = params["latent_embedding.weight"].to(h_context.dtype)
    if config.discrete_estimator == "enumerate" or not training:
        condition = torch.cat([h_context.unsqueeze(2).expand(members, batch, k, -1),
                               latent.unsqueeze(1).expand(members, batch, k, -1)], dim=-1)
        nll = token_nll(params, config, decoder_input, target, condition, dropped)
        nll = (q.unsqueeze(-1) * nll).sum(dim=2)
        z_mean = torch.bmm(q.to(latent.dtype), latent)
    else:  # F.gumbel_softmax(q_logits, tau, hard=True) with the given draws
        soft = ((q_logits + noise) / temperature).softmax(dim=-1)
        hard = torch.zeros_like(q_logits).scatter_(-1, soft.max(dim=-1, keepdim=True)[1], 1.0)
        sample = hard - soft.detach() + soft
        z_mean = torch.bmm(sample.to(h_context.dtype), latent)
        nll = token_nll(params, config, decoder_input, target, torch.cat([h_context, z_mean], dim=-1),
                        dropped)
    bow = _bow(params, torch.cat([h_context, z_mean], dim=-1))
    return {"token_nll": nll, "kl": kl, "bow_logits": bow, "posterior_probs": q}
