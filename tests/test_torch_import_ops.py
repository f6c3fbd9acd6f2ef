"""The ATen table entry by entry: small torch functions and modules imported with sg.from_torch give
torch's values and torch.autograd's gradients w.r.t. every float input, parameter and buffer
(float64, rtol 1e-10); what cannot be imported is reported all at once with source lines."""

from __future__ import annotations

import numpy as np
import pytest
import semigrad as sg

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def _t(*shape, seed=0, positive=False):
    x = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    return x.abs() + 0.5 if positive else x


class Fn(nn.Module):
    """A function with its own float64 parameters ``w`` (so their gradients are checked too)."""

    def __init__(self, fn, **params):
        super().__init__()
        self.fn = fn
        for k, v in params.items():
            self.register_parameter(k, nn.Parameter(v))

    def forward(self, *args):
        return self.fn(self, *args)


def _m(module):
    torch.manual_seed(0)
    return module.double().eval()


CASES = {
    # name: (module, example args)
    "elementwise": (Fn(lambda m, x: torch.sigmoid(x) * torch.exp(-x) + torch.sin(x) / (torch.cos(x) + 2)
                       - torch.tanh(x) ** 2 + torch.abs(x) + torch.log1p(x * x) + torch.expm1(x / 3)), (_t(5),)),
    "scalar_ops": (Fn(lambda m, x: 1 - 2 * x + x / 3 - torch.rsqrt(x) + torch.reciprocal(x) + 2 ** x
                      + torch.sqrt(x) * torch.log(x)), (_t(4, positive=True),)),
    "compare_where": (Fn(lambda m, x, y: torch.where(x > y, x * y, torch.maximum(x, y) - torch.minimum(x, 0.5 * y))
                         + torch.where(x <= 0.1, 0.0, x)), (_t(3, 4), _t(4, seed=1))),
    "clamp_relu": (Fn(lambda m, x: torch.clamp(x, -0.5, 0.7) + F.leaky_relu(x, 0.1) + F.hardtanh(x)
                      + torch.relu(x) + F.relu6(x)), (_t(10),)),
    "gelu_both": (Fn(lambda m, x: F.gelu(x) + F.gelu(x, approximate="tanh")), (_t(7),)),
    "reductions": (Fn(lambda m, x: torch.cat([x.sum(0), x.mean(1), x.amax(1), x.amin(0), x.var(1),
                                               x.sum().reshape(1), x.std(0), torch.logsumexp(x, 1),
                                               x.max(dim=1).values, x.mean().reshape(1), x.min(0, keepdim=True).values[0]])),
                   (_t(3, 4),)),
    "cumsum_argmax": (Fn(lambda m, x: torch.cumsum(x, 1) * 2 + torch.gather(x, 1, x.argmax(1, keepdim=True))
                         + torch.index_select(x, 1, x[0].argmin()).expand(3, 4)
                         * torch.gather(x, 1, x.min(dim=1).indices.reshape(3, 1))), (_t(3, 4),)),
    "shapes": (Fn(lambda m, x: torch.cat([x.permute(2, 0, 1).reshape(-1), x[:, 1:, ::2].flatten(),
                                          x.transpose(0, 1)[0].reshape(-1), x.unsqueeze(0).expand(2, 2, 3, 4).sum(0)
                                          .flatten(), torch.flip(x, [0, 2]).flatten(), x[1, 2],
                                          torch.stack([x[0], x[1]], 1).flatten()])), (_t(2, 3, 4),)),
    "split_unbind_pad": (Fn(lambda m, x: torch.cat([*(p.sum(1) for p in torch.split(x, [1, 3], 1)),
                                                    *torch.unbind(x, 0), F.pad(x, (1, 2, 0, 1), value=0.5).flatten()])),
                         (_t(2, 4),)),
    "matmuls": (Fn(lambda m, a, b: (a @ b).sum(0) + torch.bmm(a, b).sum(0) + torch.addmm(m.w[0], a[0], b[0], beta=0.5,
                                                                                          alpha=2.0)
                   + torch.baddbmm(m.w, a, b).sum(0) + torch.einsum("bij,bjk->ik", a, b),
                   w=_t(2, 3, 5, seed=7)), (_t(2, 3, 4), _t(2, 4, 5, seed=1))),
    "softmaxes": (Fn(lambda m, x: torch.softmax(x, -1) * torch.log_softmax(x, 0) + torch.softmax(x @ m.w, 1)[:, :1],
                     w=_t(4, 4, seed=3)), (_t(3, 4),)),
    "layer_norm": (nn.Sequential(nn.LayerNorm(6), nn.Linear(6, 6), nn.LayerNorm((2, 6), elementwise_affine=False)),
                   (_t(2, 6),)),
    "batch_norm_eval": (nn.Sequential(nn.Conv2d(2, 3, 2), nn.BatchNorm2d(3), nn.Flatten(), nn.Linear(3 * 4 * 4, 2)),
                        (_t(1, 2, 5, 5),)),
    "embedding_index_select": (Fn(lambda m, i, x: (F.embedding(i, m.w) * 2).sum(1) + torch.index_select(m.w, 0, i[0]).sum(0)
                                  + x, w=_t(7, 5, seed=4)),
                               (torch.tensor([[1, 6, 1, 0, 4]]), _t(1, 7, seed=2)[:, :5])),
    "conv1d": (nn.Sequential(nn.Conv1d(4, 6, 3, stride=2, padding=2, dilation=2, groups=2), nn.Tanh(),
                             nn.MaxPool1d(2), nn.AvgPool1d(2, stride=1, padding=1)), (_t(2, 4, 13),)),
    "conv2d": (nn.Sequential(nn.Conv2d(3, 4, (3, 2), stride=(2, 1), padding=(1, 0)), nn.Sigmoid(),
                             nn.MaxPool2d(2, stride=1, padding=1), nn.AvgPool2d(2), nn.Conv2d(4, 2, 1, bias=False)),
               (_t(2, 3, 7, 6),)),
    "dropout_eval": (nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.5), nn.ReLU()), (_t(2, 3),)),
    "advanced_indexing": (Fn(lambda m, x: torch.cat([
        x[torch.tensor([[0, 1]]), :, torch.tensor([-1, 2])].flatten(),  # two apart: the indexed axis first
        x[:, torch.tensor([2, -3])][..., torch.tensor([0, 0, 3])].flatten(),
        torch.zeros(2, 3, 4, dtype=torch.float64).scatter_add(2, torch.tensor([[[3, 0], [1, 1], [0, 2]]] * 2), x[..., :2]).flatten(),
        x.index_put((torch.tensor([1, 0, 1]),), m.w, accumulate=True).flatten(),
        torch.topk(x, 2, dim=1).values.flatten(), x.repeat(2, 1, 1, 2).flatten(),
        (x * torch.cumsum(torch.ones(3, 4, dtype=torch.int64), 1)).flatten()]), w=_t(4, seed=6)),
        (_t(2, 3, 4),)),
    "two_outputs": (Fn(lambda m, x: (x * m.w, (x @ m.w.T).tanh()), w=_t(3, 3, seed=5)), (_t(3,),)),
}


def _reference(module, args, seeds):
    """Outputs and torch.autograd gradients of <outputs, seeds> w.r.t. float inputs and parameters
    (torch refuses gradients of batch
    norm's running statistics)."""
    state = {**{k: v.detach().clone().requires_grad_() for k, v in module.named_parameters()},
             **dict(module.named_buffers())}
    inputs = [a.detach().clone().requires_grad_(a.is_floating_point()) for a in args]
    outs = torch.func.functional_call(module, state, tuple(inputs))
    outs = outs if isinstance(outs, tuple) else (outs,)
    wrt = {k: v for k, v in state.items() if v.requires_grad}
    wrt.update({f"arg{i}": a for i, a in enumerate(inputs) if a.requires_grad})
    grads = torch.autograd.grad(outs, list(wrt.values()), grad_outputs=[torch.from_numpy(s) for s in seeds],
                                allow_unused=True)
    return [o.detach().numpy() for o in outs], {k: (np.zeros(v.shape) if g is None else g.numpy())
                                                 for (k, v), g in zip(wrt.items(), grads)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_torch(name, client, rng):
    module, args = CASES[name]
    module = _m(module)
    result = sg.from_torch(module, args)
    with torch.no_grad():
        outs = module(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    seeds = [rng.standard_normal(o.shape) for o in outs]
    want_outs, want_grads = _reference(module, args, seeds)
    graph = client.register(result.graph)
    float_args = [name for name, a in zip(result.user_inputs, args) if a.is_floating_point()]
    wrt = list(result.parameters) + float_args
    grads, got = graph.gradient(result.inputs_for(*args), wrt=wrt, return_outputs=True,
                                seeds=dict(zip(result.outputs, seeds)))
    for output, want in zip(result.outputs, want_outs):
        np.testing.assert_allclose(got[output], want, rtol=1e-10, atol=1e-12, err_msg=output)
    renamed = dict(zip(result.user_inputs, (f"arg{i}" for i, a in enumerate(args))))
    for key, g in grads.items():
        want = want_grads[renamed.get(key, key)]
        np.testing.assert_allclose(g, want, rtol=1e-10, atol=1e-12 * max(1.0, np.abs(want).max()), err_msg=key)
    assert set(renamed.get(k, k) for k in grads) == set(want_grads)


def test_decomposed_builds_the_fused_ops_from_primitives(client, rng):
    """decomposed=True: no fused softmax, log_softmax or layer_norm node, same values and
    gradients as torch (the default imports them fused: checked in CASES above)."""
    module = _m(Fn(lambda m, x: torch.softmax(x @ m.w, -1) + torch.log_softmax(x, 0)
                   + torch.logsumexp(x, 1, keepdim=True) + F.layer_norm(x, (4,)), w=_t(4, 4, seed=3)))
    x = _t(3, 4)
    fused = {n.op for n in sg.from_torch(module, (x,)).graph.to_proto().nodes}
    result = sg.from_torch(module, (x,), decomposed=True)
    ops = {n.op for n in result.graph.to_proto().nodes}
    assert {"softmax", "log_softmax", "layer_norm"} <= fused  # torch itself decomposes logsumexp
    assert not ops & {"softmax", "log_softmax", "logsumexp", "layer_norm"}, ops
    seed = rng.standard_normal((3, 4))
    want_outs, want_grads = _reference(module, (x,), [seed])
    (arg,) = result.user_inputs
    grads, got = client.register(result.graph).gradient(result.inputs_for(x), wrt=["w", arg],
                                                         seeds={"output": seed}, return_outputs=True)
    np.testing.assert_allclose(got["output"], want_outs[0], rtol=1e-10)
    np.testing.assert_allclose(grads["w"], want_grads["w"], rtol=1e-10)
    np.testing.assert_allclose(grads[arg], want_grads["arg0"], rtol=1e-10, atol=1e-13)


def test_decomposed_ops_inner_nodes_never_take_a_later_torch_node_s_name(client, rng):
    """The inner nodes of a decomposed layer_norm or softmax are named as the graph names nodes
    (``mul_2``); a torch node of that name imported later takes another (BERT-base with
    decomposed=True was refused: "name 'mul_6' is already used in this graph")."""
    def fn(x):
        for _ in range(3):
            x = F.layer_norm(x, (x.shape[-1],)) * 1.5
            x = torch.softmax(x, -1) * 0.5 + x * 2.0
        return x

    x = _t(3, 5)
    result = sg.from_torch(fn, (x,), decomposed=True)
    seed = rng.standard_normal((3, 5))
    want_outs, want_grads = _reference(_m(Fn(lambda m, x: fn(x))), (x,), [seed])
    (arg,) = result.user_inputs
    grads, got = client.register(result.graph).gradient(result.inputs_for(x), wrt=[arg], seeds={"output": seed},
                                                         return_outputs=True)
    np.testing.assert_allclose(got["output"], want_outs[0], rtol=1e-10)
    np.testing.assert_allclose(grads[arg], want_grads["arg0"], rtol=1e-10, atol=1e-13)


def test_indices_nobody_reads_add_no_node():
    """max(dim) returns values and indices; only read indices become argmax nodes (an unread one
    would make the scalar and symbolic backends refuse the graph for nothing)."""
    values_only = sg.from_torch(lambda x: x.max(dim=1).values, (_t(3, 4),))
    both = sg.from_torch(lambda x: x.max(dim=1).indices, (_t(3, 4),))
    assert "argmax" not in {n.op for n in values_only.graph.to_proto().nodes}
    assert "argmax" in {n.op for n in both.graph.to_proto().nodes}


def test_unsupported_ops_are_listed_at_once_with_their_lines():
    def model(x):
        a = torch.sort(x).values  # line A
        b = torch.remainder(a, 2.0)  # line B: unsupported, and after an unsupported op
        return a + b + torch.sin(x)

    with pytest.raises(sg.TorchImportError) as info:
        sg.from_torch(model, (_t(5),))
    message = str(info.value)
    ops = {op for op, *_ in info.value.problems}
    assert {"aten.sort.default", "aten.remainder.Scalar"} <= ops, message
    assert "aten.sin.default" not in ops
    assert "torch.sort(x).values  # line A" in message and "torch.remainder(a, 2.0)  # line B" in message
    assert "test_torch_import_ops.py" in message


def test_dtype_casts_are_refused_by_name():
    """A cast between float dtypes, or from floats to ints, has no exact form without a cast op:
    refused by name (int64 * float64 is torch's promotion, which imports: below)."""
    def model(x, i):
        return x * i + x.float().sum() + x.long()

    with pytest.raises(sg.TorchImportError) as info:
        sg.from_torch(model, (_t(3), torch.tensor([1, 2, 3])))
    reasons = [(op, why) for op, _, _, why in info.value.problems]
    assert {op for op, _ in reasons} == {"aten._to_copy.default"}, str(info.value)
    assert "float64 to float32" in reasons[0][1] and "float64 to int64" in reasons[1][1]


def test_exact_casts_and_type_promotion(client):
    """bool and int64 tensors meet float64 ones as torch promotes them (mul of int64 and float64,
    bool.double(), a bool sum counted in int64, an int64 cumsum), with the values torch gives."""
    def model(x, i):
        return x * i + (x > 0).double() * torch.cumsum(i, 0) + (x > 0.5).sum() / x + torch.cumsum(x < 0, 0)

    x, i = _t(5), torch.tensor([3, -1, 4, 1, 5])
    result = sg.from_torch(model, (x, i))
    got = client.register(result.graph).evaluate(result.inputs_for(x, i))["output"]
    want = x * i + (x > 0).double() * torch.cumsum(i, 0) + (x > 0.5).sum() / x + torch.cumsum(x < 0, 0)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-14)


def _floor_of_grid(n):
    """A model adding a constant grid made by an op the table lacks (floor) to its input."""
    def model(x):
        return x + torch.floor(torch.arange(n, dtype=torch.float64) / 3)

    return model


def test_constant_subgraphs_are_computed_by_torch_up_to_the_cap(client):
    """Calls of constants only are folded by torch at import (floor has no entry in the table);
    at MAX_FOLDED_ELEMENTS elements they still are, one past it they go through the table, which
    refuses floor by name."""
    from semigrad.torch_import.importer import MAX_FOLDED_ELEMENTS

    n = MAX_FOLDED_ELEMENTS
    x = _t(n)
    result = sg.from_torch(_floor_of_grid(n), (x,))
    got = client.register(result.graph).evaluate(result.inputs_for(x))["output"]
    np.testing.assert_array_equal(got, x.numpy() + np.floor(np.arange(n) / 3))
    with pytest.raises(sg.TorchImportError) as info:
        sg.from_torch(_floor_of_grid(n + 1), (_t(n + 1),))
    assert {op for op, *_ in info.value.problems} == {"aten.floor.default"}


def test_nondeterministic_and_uninitialised_constants_are_not_folded():
    """torch.rand of constants is not computed at import (each call differs): refused by name."""
    def model(x):
        return x + torch.rand(3, dtype=torch.float64)

    with pytest.raises(sg.TorchImportError) as info:
        sg.from_torch(model, (_t(3),))
    assert {op for op, *_ in info.value.problems} == {"aten.rand.default"}


def test_a_module_that_mutates_its_buffers_is_refused():
    with pytest.raises(sg.TorchImportError, match="mutates 'running_mean'.*eval mode"):
        sg.from_torch(nn.BatchNorm1d(3).double().train(), (_t(4, 3),))


def test_params_as_constants(client):
    module = _m(nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)))
    x = _t(3)
    result = sg.from_torch(module, (x,), params="constants")
    assert [i.name for i in result.graph.to_proto().inputs] == ["input"] == list(result.user_inputs)
    assert result.parameters == {} and result.buffers == {}
    got = client.register(result.graph).evaluate({"input": x.numpy()})["output"]
    np.testing.assert_allclose(got, module(x).detach().numpy(), rtol=1e-12)


def test_names_follow_the_state_dict_and_the_modules():
    module = _m(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Tanh()))
    result = sg.from_torch(module, (_t(2, 3),))
    assert list(result.parameters) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert list(result.buffers) == ["1.running_mean", "1.running_var"]  # num_batches_tracked is unused: no input
    inputs = {i.name for i in result.graph.to_proto().inputs}
    assert inputs == {"input", *result.parameters, *result.buffers}
    tanh = result.nodes["tanh"]
    assert tanh == "tanh" and result.modules[tanh] == "2"
    assert {result.modules[i] for i in result.modules if i.startswith("addmm")} == {"0"}


def test_bad_params_choice():
    with pytest.raises(ValueError, match="params must be one of"):
        sg.from_torch(nn.Linear(2, 2), (_t(2),), params="weights")


def _mlp(hidden=5, out=3):
    return _m(nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, out)))


def test_counting_semiring_over_an_imported_mlp(client):
    """Path counts through y = W2 tanh(W1 x + b1) + b2 (random, nonzero weights), by hand: every
    input element reaches every output through each of the H hidden units (H·O paths), an
    element of W1 through its own hidden unit (O paths), of W2 and b2 one path, of b1 O paths."""
    hidden, out = 5, 3
    result = sg.from_torch(_mlp(hidden, out), (_t(1, 4),))
    graph = client.register(result.graph)
    counts = graph.gradient(result.inputs_for(_t(1, 4, seed=9)), semiring="counting",
                            wrt=["input", *result.parameter_names])
    np.testing.assert_array_equal(counts["input"], np.full((1, 4), hidden * out))
    np.testing.assert_array_equal(counts["0.weight"], np.full((hidden, 4), out))
    np.testing.assert_array_equal(counts["0.bias"], np.full(hidden, out))
    np.testing.assert_array_equal(counts["2.weight"], np.ones((out, hidden)))
    np.testing.assert_array_equal(counts["2.bias"], np.ones(out))


def test_an_intermediate_node_by_its_torch_name(client, rng):
    """The gradient at the Tanh module's output, asked for by the exported node's name, equals
    torch's gradient of that activation (retain_grad in a forward hook)."""
    module = _mlp()
    x = _t(1, 4, seed=10)
    result = sg.from_torch(module, (x,))
    seen = {}

    def keep(mod, inp, out):
        out.retain_grad()
        seen["tanh"] = out

    hook = module[1].register_forward_hook(keep)
    seed = rng.standard_normal((1, 3))
    module(x).backward(torch.from_numpy(seed))
    hook.remove()
    node = result.nodes["tanh"]
    assert result.modules[node] == "1"
    grads = client.register(result.graph).gradient(result.inputs_for(x), seeds={"output": seed}, retain=[node])
    np.testing.assert_allclose(grads.retained[node], seen["tanh"].grad.numpy(), rtol=1e-12)


class Tied(nn.Module):
    """An embedding tied to the output layer, a keyword argument and a dict of outputs."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, tokens, *, scale):
        hidden = self.emb(tokens) * scale
        return {"logits": self.head(hidden), "hidden": hidden}


def test_tied_weights_keyword_arguments_and_dict_outputs(client, rng):
    module = _m(Tied())
    tokens, scale = torch.tensor([[1, 2, 3, 2]]), torch.tensor(1.5, dtype=torch.float64)
    result = sg.from_torch(module, (tokens,), {"scale": scale})
    assert result.parameter_names == [k for k, _ in module.named_parameters()] == ["emb.weight"]
    assert result.user_inputs == ("tokens", "scale") and result.outputs == ("logits", "hidden")
    seeds = {"logits": rng.standard_normal((1, 4, 10)), "hidden": rng.standard_normal((1, 4, 4))}
    grads = client.register(result.graph).gradient(result.inputs_for(tokens, scale=scale),
                                                   wrt=["emb.weight", "scale"], seeds=seeds)
    scale = scale.clone().requires_grad_()
    out = module(tokens, scale=scale)
    torch.autograd.backward([out["logits"], out["hidden"]], [torch.from_numpy(seeds["logits"]),
                                                             torch.from_numpy(seeds["hidden"])])
    np.testing.assert_allclose(grads["emb.weight"], module.emb.weight.grad.numpy(), rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(grads["scale"], scale.grad.numpy(), rtol=1e-10)


def test_a_float32_model_is_a_float32_graph(client):
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 2)).eval()
    x = torch.randn(1, 3, 6, 6)
    result = sg.from_torch(module, (x,))
    grads, outs = client.register(result.graph).gradient(result.inputs_for(x), wrt=result.parameter_names,
                                                         return_outputs=True)
    module(x).sum().backward()
    assert outs["output"].dtype == np.float32 and grads["0.weight"].dtype == np.float32
    np.testing.assert_allclose(outs["output"], module(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    for name, p in module.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


def test_an_exported_program_imports_like_its_module():
    module = _mlp()
    x = _t(1, 4)
    from_module = sg.from_torch(module, (x,))
    from_program = sg.from_torch(torch.export.export(module, (x,)))
    assert from_program.graph.to_proto() == from_module.graph.to_proto()
    assert from_program.parameter_names == from_module.parameter_names


def test_hardsigmoid_gradient_is_the_closed_form(client):
    """F.hardsigmoid imports exactly: gradient 1/6 inside (-3, 3), 0 outside. (torch.autograd's own
    float64 gradient is float32's 1/6, 0.1666666716..., a relative 3e-8 off: the closed form is the
    reference here, not torch.)"""
    x = torch.tensor([-4.0, -2.5, -0.3, 0.7, 2.9, 3.5], dtype=torch.float64)
    result = sg.from_torch(lambda v: torch.nn.functional.hardsigmoid(v), (x,))
    (arg,) = result.user_inputs
    grads, outs = client.register(result.graph).gradient(result.inputs_for(x), wrt=[arg], return_outputs=True)
    inside = np.abs(x.numpy()) < 3
    np.testing.assert_allclose(outs["output"], np.clip(x.numpy() / 6 + 0.5, 0, 1), rtol=1e-15)
    np.testing.assert_array_equal(grads[arg], np.where(inside, 1 / 6, 0.0))
