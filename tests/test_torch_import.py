"""sg.from_torch against torch.autograd: outputs and the gradient of every parameter, in float64
(rtol 1e-10), on single inputs and on batches (a semigrad batch axis is torch.func.vmap), on a
transformer encoder, a small CNN and an RNN cell unrolled 10 steps, in process and remote (the
``client`` fixture runs each test both ways: this module is in conftest's IN_PROCESS_MODULES)."""

from __future__ import annotations

import numpy as np
import pytest
import semigrad as sg

torch = pytest.importorskip("torch")
nn = torch.nn

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # from torch.export's internals

RTOL = 1e-10


# ---------------------------------------------------------------- models

class Transformer(nn.Module):
    """nn.TransformerEncoder (2 layers, d_model 128, 4 heads, feed-forward 512, GELU) behind an
    embedding and a linear head."""

    def __init__(self, vocab=50, d_model=128, classes=10):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, 4, 512, activation="gelu", batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens):
        return self.head(self.enc(self.emb(tokens)))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(torch.relu(self.conv(x))), 1))


class RNN(nn.Module):
    """nn.RNNCell unrolled over the 10 steps of ``xs``."""

    def __init__(self):
        super().__init__()
        self.cell = nn.RNNCell(4, 6)

    def forward(self, xs, h):
        for t in range(xs.shape[0]):
            h = self.cell(xs[t], h)
        return h


def _seeded(cls):
    torch.manual_seed(0)
    return cls().double().eval()


def _tokens(shape):
    return torch.randint(0, 50, shape, generator=torch.Generator().manual_seed(1))


def _normal(*shape, seed=2):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


MODELS = {
    # name: (model class, example arguments of one item, a batch of B items stacked on a new axis 0)
    "transformer": (Transformer, lambda: (_tokens((1, 8)),), lambda b: (_tokens((b, 1, 8)),)),
    "cnn": (CNN, lambda: (_normal(1, 3, 8, 8),), lambda b: (_normal(b, 1, 3, 8, 8, seed=3),)),
    "rnn": (RNN, lambda: (_normal(10, 1, 4), _normal(1, 6, seed=4)),
            lambda b: (_normal(b, 10, 1, 4, seed=5), _normal(b, 1, 6, seed=6))),
}


@pytest.fixture(scope="module")
def imported():
    """Each model, exported once per module: (model, its import)."""
    cache = {}

    def get(name):
        if name not in cache:
            cls, example, _ = MODELS[name]
            model = _seeded(cls)
            cache[name] = model, sg.from_torch(model, example())
        return cache[name]

    return get


def _torch_reference(model, args, seed):
    """Output and gradients (of <output, seed>) w.r.t. every named parameter, by torch.autograd."""
    params = dict(model.named_parameters())
    out = model(*args)
    grads = torch.autograd.grad(out, list(params.values()), grad_outputs=seed)
    return out.detach().numpy(), {k: g.numpy() for k, g in zip(params, grads)}


def _assert_matches(got_out, got_grads, want_out, want_grads):
    np.testing.assert_allclose(got_out, want_out, rtol=RTOL, atol=1e-12)
    assert set(got_grads) == set(want_grads)
    for key, want in want_grads.items():
        scale = np.max(np.abs(want)) or 1.0
        np.testing.assert_allclose(got_grads[key], want, rtol=RTOL, atol=RTOL * scale, err_msg=key)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_single_input_matches_torch(name, imported, client, rng):
    model, result = imported(name)
    args = MODELS[name][1]()
    assert set(result.parameter_names) == {k for k, _ in model.named_parameters()}
    seed = rng.standard_normal(model(*args).shape)
    want_out, want_grads = _torch_reference(model, args, torch.from_numpy(seed))
    graph = client.register(result.graph)
    grads, outs = graph.gradient(result.inputs_for(*args), wrt=result.parameter_names,
                                 seeds={"output": seed}, return_outputs=True)
    _assert_matches(outs["output"], grads, want_out, want_grads)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_batch_axis_is_vmap(name, imported, client, rng):
    """B items with a leading batch axis: one output and one gradient per item, as a loop in torch."""
    model, result = imported(name)
    batch = MODELS[name][2](3)
    graph = client.register(result.graph)
    out_shape = model(*MODELS[name][1]()).shape
    seeds = rng.standard_normal((3, *out_shape))
    grads, outs = graph.gradient(result.inputs_for(*batch), wrt=result.parameter_names,
                                 seeds={"output": seeds}, return_outputs=True)
    for i in range(3):
        want_out, want_grads = _torch_reference(model, [a[i] for a in batch], torch.from_numpy(seeds[i]))
        _assert_matches(outs["output"][i], {k: g[i] for k, g in grads.items()}, want_out, want_grads)


def test_exported_batch_dimension_sums_gradients(client, rng):
    """A model exported with a batch dimension of its own (4 images): one item whose parameter
    gradients are summed over the images, exactly as torch's backward of the batch."""
    model = _seeded(CNN)
    images = _normal(4, 3, 8, 8, seed=7)
    result = sg.from_torch(model, (images,))
    seed = rng.standard_normal((4, 5))
    want_out, want_grads = _torch_reference(model, (images,), torch.from_numpy(seed))
    grads, outs = client.register(result.graph).gradient(
        result.inputs_for(images), wrt=result.parameter_names, seeds={"output": seed}, return_outputs=True)
    _assert_matches(outs["output"], grads, want_out, want_grads)
