"""Benchmark: semiring backward passes on a BERT-shaped encoder and an MLP imported from PyTorch,
against PyTorch's own backward on the same model, in the same run (issue 15, acceptance).

Models (random weights, float64, eval mode), imported with `sg.from_torch` (parameters as
graph inputs), run in-process (`semigrad.Client()`, the engine in this process):

* bert: `nn.TransformerEncoder` of `--layers` layers (d_model `--d-model`, `--heads` heads,
  feed-forward `--ff`, GELU, no dropout) over one sequence of `--seq` embeddings, and a linear
  head on the first position: one logit. Defaults: BERT-base, 12 × 768 / 12 heads / 3072, 128
  tokens. The input is the embedding matrix x (1, seq, d_model): gradients are "for every
  embedding element".
* mlp: x (rows, width) -> Linear(width, hidden) -> tanh -> Linear(hidden, width) -> sum.

float64 because the semiring carriers are float64 (a float32 graph is lifted to float64 in
every semiring op anyway, so float32 would only make PyTorch's side cheaper) and because path
products over 12 layers leave float32's range long before float64's.

Per model, after one untimed round (every call once: semigrad compiles each request's plan on
its first call, 2-7 s per semiring at BERT-base size), timed in alternation (`--repeats` rounds,
each on a fresh random input; the best of them reported, the least disturbed on a shared
machine):

* torch: `model(x)` then `.backward()` with x and every parameter requiring grad (PyTorch's
  ordinary backward), and `model(x)` alone under `torch.no_grad()` (its forward);
* semigrad: the forward (`evaluate`), the real gradient w.r.t. x, each semiring of
  `--semirings` alone (none by default at BERT-base size: minutes each), and
  `semiring=[real, max_product, entropy]` in ONE request.

Backward cost = gradient time − forward time; the table gives each semiring's backward ÷ the
real backward (goal ≤ 2 for max_product and entropy), and the one request ÷ PyTorch's
forward + backward (acceptance: ≤ 3). The last round's results are checked: the real gradient
(alone and in the one request) against torch.autograd, each member of the one request against
its own request (where timed alone), max_product ≥ 0 and a finite entropy.

Run from the repo root:
    .venv/bin/python bench/semiring_bert.py               # BERT-base + MLP: minutes, and ~3 GB of memory
    .venv/bin/python bench/semiring_bert.py --quick       # 2 layers × 256 wide, 32 tokens: ~1 min
    .venv/bin/python bench/semiring_bert.py --layers 2    # any size: --seq --d-model --heads --ff --rows --width --hidden
    .venv/bin/python bench/semiring_bert.py --decomposed  # softmax, layer_norm as primitive ops (O(n) edges a row)
Prints a markdown report on stdout (progress on stderr); exits 1 if a check fails.
Arguments meant for other benchmarks (bench/run.py passes its arguments to all) are ignored.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")  # one core each, PyTorch too (below): the same footing

import argparse  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402

from common import fmt, machine_info, markdown_table, rerun_command, section  # noqa: E402

PRODUCT = ["real", "max_product", "entropy"]
SEMIRINGS = ["max_product", "entropy", "log_entropy", "maxplus", "counting"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=None, help="encoder layers (default 12; 2 with --quick)")
    p.add_argument("--seq", type=int, default=None, help="tokens (default 128; 32 with --quick)")
    p.add_argument("--d-model", type=int, default=None, help="width (default 768; 256 with --quick)")
    p.add_argument("--heads", type=int, default=None, help="attention heads (default 12; 4 with --quick)")
    p.add_argument("--ff", type=int, default=None, help="feed-forward width (default 3072; 1024 with --quick)")
    p.add_argument("--rows", type=int, default=64, help="MLP rows (default 64)")
    p.add_argument("--width", type=int, default=256, help="MLP input/output width (default 256)")
    p.add_argument("--hidden", type=int, default=1024, help="MLP hidden width (default 1024)")
    p.add_argument("--semirings", nargs="*", default=None, metavar="NAME",
                   help=f"semirings timed alone (default: {' '.join(SEMIRINGS)}; none at BERT-base size)")
    p.add_argument("--repeats", type=int, default=None, help="alternating rounds (default 3; 1 at full BERT size)")
    p.add_argument("--models", default="bert,mlp", help="comma-separated: bert, mlp (default both)")
    p.add_argument("--quick", action="store_true", help="small sizes, for checking that it runs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--decomposed", action="store_true",
                   help="import softmax, log_softmax and layer_norm decomposed into primitive ops "
                        "(sg.from_torch(decomposed=True): O(n) edges per row instead of the fused ops' n^2)")
    args, ignored = p.parse_known_args(argv)
    if ignored:
        print(f"semiring_bert.py: ignoring arguments of other benchmarks: {' '.join(ignored)}", file=sys.stderr)
    small = dict(layers=2, seq=32, d_model=256, heads=4, ff=1024)
    base = dict(layers=12, seq=128, d_model=768, heads=12, ff=3072)
    for key in base:
        if getattr(args, key) is None:
            setattr(args, key, (small if args.quick else base)[key])
    full = args.layers * args.seq * args.d_model >= 12 * 128 * 768 / 4
    if args.semirings is None:
        args.semirings = [] if full else SEMIRINGS
    if args.repeats is None:
        args.repeats = 1 if full else 3
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    return args


def resolved_argv(args) -> list[str]:
    return ["--layers", str(args.layers), "--seq", str(args.seq), "--d-model", str(args.d_model),
            "--heads", str(args.heads), "--ff", str(args.ff), "--rows", str(args.rows), "--width", str(args.width),
            "--hidden", str(args.hidden), "--semirings", *args.semirings, "--repeats", str(args.repeats),
            "--models", ",".join(args.models), "--seed", str(args.seed)] + (["--decomposed"] if args.decomposed else [])


def bert_model(args):
    import torch
    from torch import nn

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            layer = nn.TransformerEncoderLayer(args.d_model, args.heads, args.ff, dropout=0.0, activation="gelu",
                                               batch_first=True)
            self.enc = nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False)
            self.head = nn.Linear(args.d_model, 1)

        def forward(self, x):
            return self.head(self.enc(x)[:, 0]).sum()

    return Encoder().double().eval(), torch.randn(1, args.seq, args.d_model, dtype=torch.float64)


def mlp_model(args):
    import torch
    from torch import nn

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.l2 = nn.Linear(args.width, args.hidden), nn.Linear(args.hidden, args.width)

        def forward(self, x):
            return self.l2(torch.tanh(self.l1(x))).sum()

    return MLP().double().eval(), torch.randn(args.rows, args.width, dtype=torch.float64)


class CheckFailed(Exception):
    pass


def bench_model(name, model, x, args, client) -> tuple[list[list[str]], dict]:
    import semigrad as sg
    import torch

    with section(f"{name}: import"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        imported = sg.from_torch(model, (x,), decomposed=args.decomposed)
        t_import = time.perf_counter() - t0
        graph = client.register(imported.graph)
    (xname,) = imported.user_inputs

    def torch_backward(x):
        xr = x.clone().requires_grad_(True)
        model.zero_grad(set_to_none=True)
        model(xr).backward()
        return xr.grad

    def torch_forward(x):
        with torch.no_grad():
            return model(x)

    def grad(semiring=None):
        kw = {} if semiring is None else {"semiring": semiring}
        return lambda x: graph.gradient(imported.inputs_for(x), wrt=[xname], **kw)

    product = "+".join(PRODUCT) + " (one request)"
    calls = {"torch forward": torch_forward, "torch forward+backward": torch_backward,
             "semigrad forward": lambda x: graph.evaluate(imported.inputs_for(x)), "real": grad()}
    calls.update({s: grad(s) for s in args.semirings})
    calls[product] = grad(PRODUCT)
    times: dict[str, list[float]] = {k: [] for k in calls}
    results = {}
    with section(f"{name}: a round untimed: each call's plan compiled, PyTorch warmed up"):
        for call in calls.values():
            call(x)
    with section(f"{name}: timing, {args.repeats} alternating rounds"):
        for _ in range(args.repeats):
            x = torch.randn(x.shape, dtype=x.dtype)  # a fresh input every round (the checks: the last round's)
            for key, call in calls.items():
                t0 = time.perf_counter()
                results[key] = call(x)
                times[key].append(time.perf_counter() - t0)
    with section(f"{name}: checks (of the last round's results)"):
        want = results["torch forward+backward"].numpy()
        tol = dict(rtol=1e-9, atol=1e-12 * np.abs(want).max())
        if not np.allclose(results["real"][xname], want, **tol):
            raise CheckFailed(f"{name}: real gradient differs from torch.autograd by "
                              f"{np.abs(results['real'][xname] - want).max()}")
        together = results[product]
        if not np.allclose(together["real"][xname], want, **tol):
            raise CheckFailed(f"{name}: real in one request differs from torch.autograd")
        for member in PRODUCT[1:]:
            if member in results and not np.array_equal(together[member][xname], results[member][xname]):
                raise CheckFailed(f"{name}: {member} in one request differs from its own request")
        best = together["max_product"][xname]
        if not np.all(best >= 0) or not np.all(np.isfinite(together["entropy"][xname])):
            raise CheckFailed(f"{name}: max_product negative or entropy not finite")
    med = {k: min(v) for k, v in times.items()}  # the best round: the least disturbed by other load
    fwd, back_real = med["semigrad forward"], med["real"] - med["semigrad forward"]
    torch_total = med["torch forward+backward"]
    rows = []
    for key, t in med.items():
        back = t - fwd if not key.startswith("torch") and key != "semigrad forward" else None
        rows.append([key, fmt(t * 1e3), f"{t / torch_total:.2f}",
                     f"{back / back_real:.2f}" if back is not None and back_real > 0 else "",
                     " ".join(f"{v * 1e3:.0f}" for v in times[key])])
    info = {"import_s": t_import, "one_request_vs_torch": med["+".join(PRODUCT) + " (one request)"] / torch_total}
    return rows, info


def main(argv=None) -> int:
    args = parse_args(argv)
    import semigrad as sg
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    out = ["# Semiring backward cost on models imported from PyTorch (bench/semiring_bert.py)", "",
           f"Rerun: `{rerun_command('bench/semiring_bert.py', resolved_argv(args))}`", "",
           markdown_table(["machine", ""], [[k, v] for k, v in machine_info()]), ""]
    builders = {"bert": (bert_model, f"BERT-shaped encoder: {args.layers} layers, d_model {args.d_model}, "
                                     f"{args.heads} heads, ff {args.ff}, {args.seq} tokens, float64"),
                "mlp": (mlp_model, f"MLP: x ({args.rows}, {args.width}) → {args.hidden} → tanh → {args.width}, float64")}
    # BERT-base's real gradient alone is 569 M elements per item under the default
    # max_request_elements (400 M): every value of the forward and backward graphs counts, the
    # 85 M weight inputs included. The benchmark raises the in-process engine's request limits.
    from semigrad_server.limits import Limits

    limits = Limits(max_request_elements=4_000_000_000, max_request_bytes=16 << 30, max_memory_bytes=16 << 30,
                    max_request_operations=10 ** 12)
    out += [f"In-process engine, request limits raised for the model sizes: max_request_elements "
            f"{limits.max_request_elements:,}, max_request_bytes {limits.max_request_bytes >> 30} GiB, "
            f"max_request_operations {limits.max_request_operations:.0e}.", ""]
    status = 0
    with sg.Client(limits=limits) as client:
        for name in args.models:
            build, title = builders[name]
            model, x = build(args)
            try:
                rows, info = bench_model(name, model, x, args, client)
            except CheckFailed as e:
                print(f"CHECK FAILED: {e}", file=sys.stderr)
                out += [f"## {title}", "", f"**check failed**: {e}", ""]
                status = 1
                continue
            out += [f"## {title}", "",
                    markdown_table(["call (w.r.t. the input embeddings)", "best ms", "÷ torch fwd+bwd",
                                    "backward ÷ real backward", f"each round (ms)"], rows), "",
                    f"Import (torch.export + conversion): {info['import_s']:.1f} s. "
                    f"One request for {', '.join(PRODUCT)} ÷ PyTorch's forward + backward: "
                    f"**{info['one_request_vs_torch']:.2f}×** (acceptance: ≤ 3×).", ""]
    print("\n".join(out))
    return status


if __name__ == "__main__":
    sys.exit(main())
