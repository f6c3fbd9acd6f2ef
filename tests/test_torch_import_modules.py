"""sg.from_torch on the standard modules and functions a user reaches for (masked transformer
layers, attention with padding, unrolled recurrent cells, normalisations, losses, activations,
padding modes, pooling modes, top-k, indexing and scatter idioms, a ViT patch embedding): outputs
and torch.autograd's gradients w.r.t. every parameter and float input, in float64 (rtol 1e-10),
on one item and on a batch of items (a semigrad batch axis is torch.func.vmap: compared with a
loop over the items in torch), in process and remote (this module is in conftest's
IN_PROCESS_MODULES). Each model is exported once, for both clients."""

from __future__ import annotations

import numpy as np
import pytest
import semigrad as sg

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

RTOL = 1e-10
F64 = torch.float64
BATCH = 2


from test_torch_import_ops import Fn, _t  # noqa: E402 - after the importorskip above


class Encoder(nn.Module):
    """nn.TransformerEncoder with a causal mask and a key padding mask. torch's own
    _detect_is_causal_mask cannot be exported (a data-dependent bool()): is_causal is given."""

    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(8, 2, 16, activation="gelu", batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, x, padding):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], dtype=F64)
        return self.enc(x, mask=mask, src_key_padding_mask=padding, is_causal=True)


class Decoder(nn.Module):
    """nn.TransformerDecoder: causal self-attention, cross-attention with a memory padding mask."""

    def __init__(self):
        super().__init__()
        self.dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 2, 16, batch_first=True), 1)

    def forward(self, x, memory, padding):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], dtype=F64)
        return self.dec(x, memory, tgt_mask=mask, tgt_is_causal=True, memory_key_padding_mask=padding)


class Attention(nn.Module):
    """nn.MultiheadAttention with a key padding mask, returning its averaged weights too."""

    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x, padding):
        out, weights = self.attn(x, x, x, key_padding_mask=padding, need_weights=True)
        return out, weights


class Cells(nn.Module):
    """nn.GRUCell, nn.RNNCell and nn.LSTMCell unrolled over the steps of xs."""

    def __init__(self):
        super().__init__()
        self.gru, self.rnn, self.lstm = nn.GRUCell(3, 4), nn.RNNCell(3, 4, nonlinearity="relu"), nn.LSTMCell(3, 4)

    def forward(self, xs, h0):
        g = r = h = h0
        c = torch.zeros_like(h0)
        for x in xs:
            g, r = self.gru(x, g), self.rnn(x, r)
            h, c = self.lstm(x, (h, c))
        return g + r + h * c


def _batch_norms():
    model = nn.Sequential(nn.Conv2d(2, 3, 2), nn.BatchNorm2d(3), nn.Flatten(), nn.Linear(12, 4), nn.BatchNorm1d(4))
    for bn in (model[1], model[4]):  # running statistics that are not the identity
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    return model


class Patches(nn.Module):
    """A ViT-style patch embedding: conv2d patches, flatten, transpose, a class token, positions."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Conv2d(3, 8, 4, stride=4)
        self.cls = nn.Parameter(torch.randn(1, 1, 8))
        self.pos = nn.Parameter(torch.randn(1, 5, 8))
        self.norm = nn.LayerNorm(8)

    def forward(self, images):
        patches = self.proj(images).flatten(2).transpose(1, 2)
        return self.norm(torch.cat([self.cls.expand(images.shape[0], -1, -1), patches], 1) + self.pos)


class _Embedding(nn.Module):
    """nn.Embedding with padding_idx (its row gets no gradient), scaled by a float input."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(6, 3, padding_idx=0)

    def forward(self, tokens, x):
        return self.emb(tokens) * x


WEIGHTS = torch.tensor([0.5, 1.5, 1.0, 2.0, 0.7], dtype=F64)
TARGETS = torch.tensor([0, 2, 4, 1])
PADDING = torch.tensor([[False, False, True], [False, False, False]])

MODULES = {
    # name: (module factory, example arguments of one item)
    "transformer_encoder_masks": (Encoder, lambda: (_t(2, 3, 8), PADDING)),
    "transformer_decoder_masks": (Decoder, lambda: (_t(2, 3, 8), _t(2, 4, 8, seed=1),
                                                    torch.tensor([[False] * 3 + [True], [False] * 4]))),
    "multihead_attention_weights": (Attention, lambda: (_t(2, 3, 8), PADDING)),
    "cells_unrolled": (Cells, lambda: (_t(3, 2, 3), _t(2, 4, seed=1))),
    "batch_norms_eval": (_batch_norms, lambda: (_t(2, 2, 3, 3),)),
    "group_instance_norm": (lambda: nn.Sequential(nn.GroupNorm(2, 4), nn.InstanceNorm1d(4, affine=True)),
                            lambda: (_t(2, 4, 3),)),
    "embedding_padding_idx": (_Embedding, lambda: (torch.tensor([[0, 3, 1, 0, 4]]), _t(1, 5, 3))),
    "cross_entropy": (lambda: Fn(lambda m, x, y: torch.stack([
        F.cross_entropy(x @ m.w, y), F.cross_entropy(x @ m.w, y, label_smoothing=0.1, ignore_index=1),
        F.cross_entropy(x @ m.w, y, weight=WEIGHTS, reduction="sum"), F.nll_loss(F.log_softmax(x, 1), y)]),
        w=_t(5, 5, seed=2)), lambda: (_t(4, 5), TARGETS)),
    "losses": (lambda: Fn(lambda m, x, y: torch.stack([
        F.mse_loss(x, y), F.l1_loss(x, y, reduction="sum"), F.smooth_l1_loss(x, y, beta=0.5), F.huber_loss(x, y),
        F.binary_cross_entropy_with_logits(x, (y > 0).double(), pos_weight=WEIGHTS[:4]),
        F.binary_cross_entropy(torch.sigmoid(x), torch.sigmoid(y)),
        F.kl_div(F.log_softmax(x, 1), F.softmax(y, 1), reduction="batchmean")])),
        lambda: (_t(3, 4), _t(3, 4, seed=1))),
    "activations": (lambda: Fn(lambda m, x: torch.stack([
        F.silu(x), F.mish(x), F.softplus(x), F.softplus(x, beta=2, threshold=1), F.elu(x), F.elu(x, 0.5), F.selu(x),
        F.celu(x, 1.5), F.leaky_relu(x), F.leaky_relu(x, 0.2), F.hardtanh(x, -0.5, 0.5), F.hardswish(x),
        F.logsigmoid(x), F.relu6(3 * x), F.softsign(x), torch.atan(x), torch.exp2(x)])),
        lambda: (_t(10) * 2,)),
    "normalize_norms": (lambda: Fn(lambda m, x: torch.cat([
        F.normalize(x, dim=1).flatten(), F.normalize(x, p=1, dim=0).flatten(), x.norm(dim=0),
        torch.linalg.vector_norm(x, 3, dim=1), torch.linalg.vector_norm(x, float("inf"), dim=1),
        torch.linalg.vector_norm(x, float("-inf")).reshape(1), F.cosine_similarity(x[:2], x[1:])])),
        lambda: (_t(3, 4),)),
    "pad_modes": (lambda: Fn(lambda m, x: torch.cat([
        F.pad(x, (1, 2), value=0.5).flatten(), F.pad(x, (1, 1, 2, 1), mode="reflect").flatten(),
        F.pad(x, (2, 1, 1, 1), mode="replicate").flatten(), F.pad(x, (1, 2, 1, 1), mode="circular").flatten()])),
        lambda: (_t(1, 2, 3, 4),)),
    "where_masked_fill": (lambda: Fn(lambda m, x: torch.where(x > 0, x, 0.1 * x) + x.masked_fill(x < -0.5, 2.0)
                                     + x.masked_fill(torch.triu(torch.ones(3, 4, dtype=torch.bool), 1), float("-inf"))
                                     .softmax(-1) + torch.nan_to_num(torch.where(torch.isnan(x), 0.0, x))),
                          lambda: (_t(3, 4),)),
    "argmax_accuracy": (lambda: Fn(lambda m, x, y: ((x @ m.w).argmax(1) == y).double().mean()
                                   + F.cross_entropy(x @ m.w, y), w=_t(5, 5, seed=2)),
                        lambda: (_t(4, 5), TARGETS)),
    "topk": (lambda: Fn(lambda m, x: (torch.topk(x, 2).values, torch.topk(x, 3, dim=0, largest=False).values,
                                      x.gather(1, torch.topk(x @ m.w, 2).indices)), w=_t(5, 5, seed=2)),
             lambda: (_t(3, 5),)),
    "vit_patch_embedding": (Patches, lambda: (_t(1, 3, 8, 8),)),
    "pooling_modes": (lambda: Fn(lambda m, x: torch.cat([
        F.avg_pool2d(x, 3, 2, 1, count_include_pad=False).flatten(), F.avg_pool2d(x, 2, 2, ceil_mode=True).flatten(),
        F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False).flatten(),
        F.avg_pool2d(x, 2, divisor_override=3).flatten(), F.max_pool2d(x, 2, 2, ceil_mode=True).flatten(),
        F.avg_pool1d(x[0], 2, 2, ceil_mode=True).flatten(), F.adaptive_avg_pool2d(x, (2, 3)).flatten(),
        F.adaptive_max_pool2d(x, 1).flatten()])),
        lambda: (_t(1, 2, 5, 5),)),
    "indexing_scatter": (lambda: Fn(lambda m, x, y, i: torch.cat([
        x[torch.arange(4), y], x[:, [1, -1]].flatten(), x[[0, 2]][:, 1:3].flatten(),
        torch.zeros(3, 5, dtype=F64).index_add(0, i, x[:3] * m.w).flatten(),
        torch.zeros(4, 7, dtype=F64).scatter_add(1, y.reshape(4, 1).expand(4, 5), x).flatten(),
        (x * torch.cumsum(x > 0, 1)).flatten(), (x * torch.cumsum(y, 0).reshape(4, 1)).flatten()]),
        w=_t(3, 5, seed=5)), lambda: (_t(4, 5), TARGETS, torch.tensor([2, 0, 2]))),
    "resize_repeat": (lambda: Fn(lambda m, x: torch.cat([
        F.interpolate(x, scale_factor=2, mode="nearest").flatten(), F.interpolate(x, size=(5, 4)).flatten(),
        F.interpolate(x, size=(4, 5), mode="nearest-exact").flatten(), x.repeat(2, 1, 1, 3).flatten()])),
        lambda: (_t(1, 2, 3, 3),)),
    "scaled_dot_product_attention": (lambda: Fn(lambda m, q, k, v: (
        F.scaled_dot_product_attention(q, k, v, is_causal=True),
        F.scaled_dot_product_attention(q, k, v, attn_mask=torch.tensor([[True, False, False], [True, True, False], [True, True, True]])))),
        lambda: (_t(1, 2, 3, 4), _t(1, 2, 3, 4, seed=1), _t(1, 2, 3, 4, seed=2))),
}


@pytest.fixture(scope="module")
def imported():
    """Each module, exported and imported once for every client: (module, its import)."""
    cache = {}

    def get(name):
        if name not in cache:
            torch.manual_seed(0)
            module = MODULES[name][0]().double().eval()
            cache[name] = module, sg.from_torch(module, MODULES[name][1]())
        return cache[name]

    return get


def _outputs(module, args):
    with torch.no_grad():
        outs = module(*args)
    return outs if isinstance(outs, tuple) else (outs,)


def _reference(module, args, seeds):
    """torch's outputs and torch.autograd's gradients of Σ <output, seed> (float outputs) w.r.t.
    the parameters and the float arguments ("arg0", "arg1"...)."""
    params = {k: v.detach().clone().requires_grad_() for k, v in module.named_parameters()}
    state = {**params, **dict(module.named_buffers())}
    inputs = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
    outs = torch.func.functional_call(module, state, tuple(inputs))
    outs = outs if isinstance(outs, tuple) else (outs,)
    wrt = {**params, **{f"arg{i}": a for i, a in enumerate(inputs) if a.requires_grad}}
    floats = [(o, torch.from_numpy(np.asarray(s))) for o, s in zip(outs, seeds) if o.is_floating_point()]
    grads = torch.autograd.grad([o for o, _ in floats], list(wrt.values()), [s for _, s in floats],
                                allow_unused=True)
    return ([o.detach().numpy() for o in outs],
            {k: np.zeros(tuple(v.shape)) if g is None else g.numpy() for (k, v), g in zip(wrt.items(), grads)})


def _check(got_outs, got_grads, want_outs, want_grads, names, renamed):
    for name, want in zip(names, want_outs):
        np.testing.assert_allclose(got_outs[name], want, rtol=RTOL, atol=1e-12, err_msg=name)
    assert {renamed.get(k, k) for k in got_grads} == set(want_grads)
    for key, got in got_grads.items():
        want = want_grads[renamed.get(key, key)]
        scale = max(1.0, float(np.abs(want).max(initial=0)))
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-12 * scale, err_msg=key)


def _seeds(module, args, rng, batch=()):
    return [rng.standard_normal(batch + tuple(o.shape)) if o.is_floating_point() else np.zeros(batch + tuple(o.shape))
            for o in _outputs(module, args)]


def _call(client, result, args, seeds):
    float_args = [name for name, a in zip(result.user_inputs, args) if a.is_floating_point()]
    floats = {name: s for name, s in zip(result.outputs, seeds) if s.any()}
    graph = client.register(result.graph)
    return graph.gradient(result.inputs_for(*args), wrt=[*result.parameter_names, *float_args],
                          seeds=floats, return_outputs=True)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_matches_torch(name, imported, client, rng):
    module, result = imported(name)
    args = MODULES[name][1]()
    seeds = _seeds(module, args, rng)
    want_outs, want_grads = _reference(module, args, seeds)
    grads, outs = _call(client, result, args, seeds)
    renamed = {n: f"arg{i}" for i, n in enumerate(result.user_inputs)}
    _check(outs, grads, want_outs, want_grads, result.outputs, renamed)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_batch_axis_is_vmap(name, imported, client, rng):
    """Two items on a leading batch axis (float arguments differ, integer ones are shared): per
    item outputs and gradients, as torch gives them item by item."""
    module, result = imported(name)
    args = MODULES[name][1]()
    items = [args, tuple(a + 0.3 * _t(*a.shape, seed=9) if a.is_floating_point() else a for a in args)]
    batch = tuple(torch.stack(column) for column in zip(*items))
    seeds = _seeds(module, args, rng, (BATCH,))
    grads, outs = _call(client, result, batch, seeds)
    renamed = {n: f"arg{i}" for i, n in enumerate(result.user_inputs)}
    for b, item in enumerate(items):
        want_outs, want_grads = _reference(module, item, [s[b] for s in seeds])
        _check({k: v[b] for k, v in outs.items()}, {k: v[b] for k, v in grads.items()}, want_outs, want_grads,
               result.outputs, renamed)
