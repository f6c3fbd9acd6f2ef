"""``from_torch``: a PyTorch module or function, through ``torch.export`` and the core ATen op
set, as a semigrad :class:`~semigrad.Graph`. torch is imported only when this is called."""

from __future__ import annotations

import importlib
import operator
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..graph import Graph
from .aten import TABLE
from .builder import Lazy, Missing, NodeBuilder, Unsupported

PARAMS = ("inputs", "constants")

# A call whose arguments are all constants (index grids of padding and resizing, masks built from
# arange and full, lifted constant tensors) is computed by torch at import time and becomes one
# const node, when its results have at most this many elements: ATen ops the table cannot express
# (a float-to-int cast of an index grid, floor) are fine there. Larger ones go through the table.
MAX_FOLDED_ELEMENTS = 1 << 16


class TorchImportError(ValueError):
    """The exported program has ops or arguments semigrad cannot express. ``problems`` lists every
    one as ``(ATen op, FX node name, source location, reason)``; the message shows them all."""

    def __init__(self, problems: Sequence[tuple[str, str, str, str]], total: int):
        self.problems = list(problems)
        lines = [f"  {op} at node '{node}' ({where}): {why}" for op, node, where, why in self.problems]
        kinds = sorted({op for op, *_ in self.problems})
        super().__init__(f"cannot import the model: {len(self.problems)} of its {total} ATen calls "
                         f"cannot be expressed in semigrad ({', '.join(kinds)}):\n" + "\n".join(lines))


@dataclass
class TorchImport:
    """A model imported by :func:`from_torch`.

    ``graph`` is the semigrad :class:`~semigrad.Graph`. Its inputs are the model's tensor
    arguments (named like the forward's parameters, ``user_inputs`` in order) and, with
    ``params="inputs"``, its parameters and buffers named by their ``state_dict()`` keys, whose
    values are in ``parameters`` and ``buffers`` (a tied weight under the name
    ``named_parameters()`` gives it). ``outputs`` are the graph's output names: "output" for one
    tensor, the keys of a dict of tensors, else "output_0", "output_1"... in the order of the
    model's flattened outputs. ``nodes`` maps each node of the exported program
    (``exported.graph``) to the semigrad node or input holding its value; ``modules`` maps semigrad
    node ids to the path of the submodule whose code made them ("enc.layers.0.linear1").
    :meth:`inputs_for` builds the ``inputs`` mapping of an evaluate or gradient call.
    """

    graph: Graph
    parameters: dict[str, np.ndarray]
    buffers: dict[str, np.ndarray]
    user_inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    nodes: dict[str, str]
    modules: dict[str, str]
    exported: object = field(repr=False)
    _leaves: tuple = field(repr=False, default=())  # per flattened forward argument: input name or None

    @property
    def parameter_names(self) -> list[str]:
        """The parameters that are graph inputs (``wrt=`` for their gradients)."""
        return list(self.parameters)

    def inputs_for(self, *args, **kwargs) -> dict[str, np.ndarray]:
        """The graph's inputs for forward arguments ``args``/``kwargs`` (torch tensors or arrays,
        structured like the example arguments), plus every parameter and buffer. Arrays may carry
        extra leading axes: a semigrad batch (one result per item, like ``torch.func.vmap``)."""
        pytree = importlib.import_module("torch.utils._pytree")
        leaves, _ = pytree.tree_flatten((tuple(args), dict(kwargs)))
        if len(leaves) != len(self._leaves):
            raise ValueError(f"the model was exported with {len(self._leaves)} flattened arguments, "
                             f"got {len(leaves)}")
        values = {**self.parameters, **self.buffers}
        for name, leaf in zip(self._leaves, leaves):
            if name is not None:
                values[name] = _array(leaf)
        return values


def from_torch(model, example_args: Sequence = (), example_kwargs: Mapping | None = None, *,
               params: str = "inputs", decomposed: bool = False, strict: bool = False) -> TorchImport:
    """Import ``model`` (a ``torch.nn.Module``, a function of tensors, or a
    ``torch.export.ExportedProgram``) as a semigrad graph.

    The model is exported with ``torch.export.export(model, example_args, example_kwargs,
    strict=strict)`` and decomposed to the core ATen op set; each ATen call becomes the semigrad
    nodes of its entry in :data:`semigrad.torch_import.aten.TABLE`. Shapes are those of the
    example arguments (a batch of them is a semigrad batch: extra leading axes on the inputs).
    ``params="inputs"`` (default) makes parameters and buffers graph inputs named by their
    ``state_dict()`` keys, so their gradients and semiring results can be asked for;
    ``params="constants"`` bakes them into the graph as consts. ``decomposed=True`` builds the fused
    ops (softmax, log_softmax, layer_norm) from primitive nodes instead: path results of
    semirings depend on it.

    Every op or argument that cannot be expressed is reported at once, with its source location,
    in a :class:`TorchImportError`; nothing is silently dropped.
    """
    if params not in PARAMS:
        raise ValueError(f"params must be one of {PARAMS}, got {params!r}")
    torch = _torch()
    if isinstance(model, torch.export.ExportedProgram):
        program = model
    else:
        if not isinstance(model, torch.nn.Module):
            model = _FunctionModule(torch, model)
        program = torch.export.export(model, tuple(example_args), dict(example_kwargs or {}), strict=strict)
    program = program.run_decompositions()
    names = _first_names(model) if isinstance(model, torch.nn.Module) else {}
    return _Importer(torch, program, params, decomposed, names).run()


def _first_names(module) -> dict[str, str]:
    """state_dict key -> the name ``named_parameters()``/``named_buffers()`` give the same tensor
    (tied weights have several keys; export may pick any, users know the first)."""
    first: dict[int, str] = {}
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        first.setdefault(id(tensor), name)
    keys = [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]
    return {name: first[id(tensor)] for name, tensor in keys if id(tensor) in first}


def _torch():
    try:
        return importlib.import_module("torch")
    except ImportError as error:
        raise ImportError("semigrad.from_torch needs PyTorch: pip install 'semigrad[torch]' "
                          "(the CPU build torch==2.13.0)") from error


def _FunctionModule(torch, fn):
    """A module whose forward is ``fn``, for exporting a plain function."""

    # torch.export keeps only frames of functions named "forward" in node.meta["stack_trace"] unless
    # a function is registered as an anchor (torch's own annotate_fn does this): register fn so
    # unsupported ops are reported at their line in it. Where torch lacks the hook, the location
    # is the wrapper's line.
    anchor = getattr(torch.fx.proxy, "_register_stack_trace_anchor", None)
    if anchor is not None:
        anchor(fn)

    class FunctionModule(torch.nn.Module):
        def forward(self, *args, **kwargs):
            return fn(*args, **kwargs)

    return FunctionModule()


_DTYPES = {"float64": "float64", "float32": "float32", "int64": "int64", "int32": "int64", "int16": "int64",
           "int8": "int64", "uint8": "int64", "bool": "bool"}


def _dtype_name(dtype) -> str | None:
    """The semigrad dtype holding torch ``dtype`` (integers widen to int64), or None."""
    return _DTYPES.get(str(dtype).removeprefix("torch."))


def _array(value) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def _location(node, skip: Sequence[str] = ()) -> str:
    """Where in the user's source ``node`` was made: the innermost frame of its stack trace outside
    the directories ``skip`` (torch's own and this package's), else the innermost frame."""
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    frames = [i for i, line in enumerate(trace) if line.strip().startswith("File ")]
    if not frames:
        return "no source location recorded"
    mine = [i for i in frames if not any(f'"{d}' in trace[i] for d in skip)]
    i = (mine or frames)[-1]
    code = trace[i + 1].strip() if i + 1 < len(trace) and i + 1 not in frames else ""
    return trace[i].strip() + (f": {code}" if code else "")


def _module_path(node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    # non-strict export writes paths like "L['self'].enc.layers[0]" in some versions
    path = re.sub(r"^L\['self'\]\.?", "", str(path))
    return re.sub(r"\[(\d+)\]", r".\1", path)


class _Importer:
    def __init__(self, torch, program, params: str, decomposed: bool, names: Mapping[str, str]):
        self.torch = torch
        self.names = names  # state_dict key -> the module's first name for that tensor
        self.program = program
        self.params = params
        self.decomposed = decomposed
        self.graph = Graph()
        self.env: dict[str, object] = {}  # FX node name -> Handle, tuple, Missing or Python value
        self.failed: set[str] = set()
        self.problems: list[tuple[str, str, str, str]] = []
        self.nodes: dict[str, str] = {}
        self.modules: dict[str, str] = {}
        self.input_names: set[str] = set()
        self.taken: set[str] = set()  # input names and node ids share one namespace
        self.skip = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))
        self.folded: dict[str, object] = {}  # FX node name -> torch's value, for calls of constants only

    def run(self) -> TorchImport:
        parameters, buffers, leaves, user_inputs = self.placeholders()
        calls = 0
        outputs: tuple[str, ...] = ()
        for node in self.program.graph.nodes:
            if node.op == "call_function":
                calls += 1
                self.call(node)
            elif node.op == "output":
                outputs = self.output(node)
            elif node.op != "placeholder":
                self.problem(node, node.op, f"FX node kind {node.op!r}")
        if self.problems:
            raise TorchImportError(self.problems, calls)
        return TorchImport(self.graph, parameters, buffers, tuple(user_inputs), outputs, self.nodes,
                           self.modules, self.program, tuple(leaves))

    # -- inputs

    def placeholders(self):
        kinds = self.torch.export.graph_signature.InputKind
        signature = self.program.graph_signature
        used = {n.name for n in self.program.graph.nodes if n.op == "placeholder" and n.users}
        placeholder = {n.name: n for n in self.program.graph.nodes if n.op == "placeholder"}
        parameters, buffers, leaves, user_inputs = {}, {}, [], []
        for spec in signature.input_specs:
            name = getattr(spec.arg, "name", None)
            node = placeholder.get(name)
            if spec.kind == kinds.USER_INPUT:
                is_tensor = node is not None and hasattr(node.meta.get("val"), "shape")
                leaves.append(name if is_tensor and name in used else None)
                if is_tensor and name in used:
                    self.env[name] = self.input(name, node)
                    user_inputs.append(name)
                elif node is not None:
                    self.env[name] = getattr(spec.arg, "value", None)
                continue
            if spec.kind in (kinds.PARAMETER, kinds.BUFFER, kinds.CONSTANT_TENSOR):
                if name not in used:
                    continue
                value = _array(self.state(spec))
                key = self.names.get(spec.target, spec.target)
                if spec.kind == kinds.CONSTANT_TENSOR and value.size <= MAX_FOLDED_ELEMENTS:
                    self.folded[name] = self.state(spec)  # calls of it alone are folded too
                if spec.kind == kinds.CONSTANT_TENSOR or self.params == "constants":
                    self.env[name] = self.graph.const(value, name=self.unique(key))
                else:
                    self.env[name] = self.input(key, node)
                    (parameters if spec.kind == kinds.PARAMETER else buffers)[key] = value
                self.nodes[name] = self.env[name].id
                continue
            self.problem(node, str(spec.kind), f"input {spec.target or name!r} of kind {spec.kind.name}")
        return parameters, buffers, leaves, user_inputs

    def state(self, spec):
        if spec.target in self.program.state_dict:
            return self.program.state_dict[spec.target]
        return self.program.constants[spec.target]

    def input(self, name: str, node):
        val = node.meta["val"]
        dtype = _dtype_name(val.dtype)
        if dtype is None:
            self.problem(node, "placeholder", f"input {name!r} has dtype {val.dtype}, which semigrad lacks")
            self.failed.add(node.name)
            return None
        if not all(isinstance(d, int) for d in val.shape):
            self.problem(node, "placeholder", f"input {name!r} has the dynamic shape {tuple(val.shape)}; "
                         "semigrad graphs have static shapes (export without dynamic_shapes)")
            self.failed.add(node.name)
            return None
        if name in self.input_names:
            raise ValueError(f"two inputs of the model are named {name!r} (a forward argument and a "
                             "parameter or buffer?); rename one, or import with params='constants'")
        self.input_names.add(name)
        self.taken.add(name)
        handle = self.graph.input(name, tuple(val.shape), dtype)
        self.nodes[node.name] = name
        return handle

    def unique(self, name: str) -> str:
        """``name`` unless an input or a node already has it (decomposed ops, sg.layer_norm(...,
        decomposed=True) and the like, name their inner nodes as the graph does: ``mul_6``)."""
        while name in self.taken or name in self.graph:
            name += "/node"
        self.taken.add(name)
        return name

    # -- calls

    def call(self, node) -> None:
        fx = self.torch.fx
        target = "getitem" if node.target is operator.getitem else str(node.target)
        if any(n.name in self.failed for n in node.all_input_nodes):
            self.failed.add(node.name)  # the cause is reported already; an op of its own missing too
            if target != "getitem" and target not in TABLE:
                self.problem(node, target, "no semigrad translation for this ATen op")
            return
        folded = self.fold(node)
        if folded is not None:
            value = self.constant(node, folded)
            self.env[node.name] = value
            if hasattr(value, "id"):
                self.nodes[node.name] = value.id
            return
        builder = None
        try:
            args = fx.node.map_arg(node.args, lambda n: self.value(n))
            kwargs = fx.node.map_arg(node.kwargs, lambda n: self.value(n))
            if node.target is operator.getitem:
                value = args[0][args[1]]
                value = value.build() if isinstance(value, Lazy) else value
            else:
                entry = TABLE.get(target)
                if entry is None:
                    raise Unsupported("no semigrad translation for this ATen op")
                val = node.meta.get("val")
                shape = tuple(val.shape) if hasattr(val, "shape") else None
                dtype = _dtype_name(val.dtype) if hasattr(val, "dtype") else None
                builder = NodeBuilder(self.graph, self.unique(node.name), target, shape, dtype, self.decomposed)
                value = entry(builder, *args, **kwargs)
            if isinstance(value, Missing):
                raise Unsupported(value.reason)
            self.check(node, target, value)
        except Unsupported as error:
            self.problem(node, target, str(error))
            self.failed.add(node.name)
            return
        except (ValueError, TypeError, IndexError) as error:  # a semigrad function refused the arguments
            self.problem(node, target, f"semigrad refused the arguments: {type(error).__name__}: {error}")
            self.failed.add(node.name)
            return
        self.env[node.name] = value
        if hasattr(value, "id"):
            self.nodes[node.name] = value.id
        path = _module_path(node)
        if path and builder is not None:
            results = {v.id for v in (value if isinstance(value, tuple) else (value,)) if hasattr(v, "id")}
            for made in [*builder.helpers, *([builder.name] if builder.name in results else [])]:
                self.modules[made] = path

    def fold(self, node):
        """torch's value of ``node`` when every argument is a constant (a call of no tensor, or of
        folded calls), deterministic and of at most MAX_FOLDED_ELEMENTS elements; else None."""
        if any(n.name not in self.folded for n in node.all_input_nodes):
            return None
        if node.target is not operator.getitem:
            tags = getattr(node.target, "tags", None)
            if (tags is None or self.torch.Tag.nondeterministic_seeded in tags
                    or str(node.target).startswith("aten.empty")):  # random, or uninitialised memory
                return None
        vals = node.meta.get("val")
        vals = vals if isinstance(vals, (tuple, list)) else (vals,)
        if not all(hasattr(v, "numel") for v in vals) or sum(v.numel() for v in vals) > MAX_FOLDED_ELEMENTS:
            return None
        fx = self.torch.fx
        args = fx.node.map_arg(node.args, lambda n: self.folded[n.name])
        kwargs = fx.node.map_arg(node.kwargs, lambda n: self.folded[n.name])
        try:
            value = node.target(*args, **kwargs)
        except Exception:  # torch cannot run it eagerly: the table decides alone
            return None
        self.folded[node.name] = value
        return value

    def constant(self, node, value):
        """A const node holding torch's folded ``value`` of ``node`` (a tuple's elements are
        folded by the getitem nodes that read them)."""
        if not hasattr(value, "shape"):
            return Missing("a tuple of constants") if isinstance(value, (tuple, list)) else value
        if _dtype_name(value.dtype) is None:
            return Missing(f"a constant of dtype {value.dtype}, which semigrad lacks")
        array = _array(value).astype(_dtype_name(value.dtype))
        return self.graph.const(array, name=self.unique(node.name))

    def value(self, node):
        value = self.env[node.name]
        if isinstance(value, Missing):
            raise Unsupported(value.reason)
        return value

    def check(self, node, target, value) -> None:
        """The table's result has the exported program's shape (a wrong one is a bug of the table)
        and dtype (a different one is a type promotion semigrad cannot make: Unsupported)."""
        val = node.meta.get("val")
        if hasattr(value, "id") and hasattr(val, "shape") and value.shape is not None:
            if tuple(value.shape) != tuple(val.shape):
                raise AssertionError(f"semigrad.torch_import: {target} at node {node.name!r} built shape "
                                     f"{value.shape}, torch has {tuple(val.shape)}")
        want = _dtype_name(getattr(val, "dtype", None))
        if hasattr(value, "id") and value.dtype is not None and want is not None and value.dtype != want:
            raise Unsupported(f"the result is {want} in torch but {value.dtype} here: a dtype cast, "
                              "which semigrad lacks")

    # -- outputs

    def output(self, node) -> tuple[str, ...]:
        kinds = self.torch.export.graph_signature.OutputKind
        specs = self.program.graph_signature.output_specs
        results = node.args[0]
        user = [(spec, result) for spec, result in zip(specs, results) if spec.kind == kinds.USER_OUTPUT]
        for spec in specs:
            if spec.kind != kinds.USER_OUTPUT:
                self.problem(node, "output", f"the model mutates {spec.target!r} ({spec.kind.name}); "
                             "semigrad graphs are pure (put the module in eval mode)")
        names = self.output_names(len(user))
        for name, (spec, result) in zip(names, user):
            if not isinstance(result, self.torch.fx.Node):
                self.problem(node, "output", f"{name} is the constant {result!r}, not a tensor")
            elif result.name not in self.failed:
                value = self.env[result.name]
                if isinstance(value, Missing):
                    self.problem(node, "output", value.reason)
                else:
                    self.graph.output(name, value)
        return tuple(names)

    def output_names(self, count: int) -> list[str]:
        """"output" for one output, a dict's keys for a dict of tensors, else "output_0", "output_1"..."""
        spec = getattr(getattr(self.program, "call_spec", None), "out_spec", None)
        if count == 1:
            return ["output"]
        if (spec is not None and spec.type is dict and all(c.is_leaf() for c in spec.children_specs)
                and len(spec.context) == count and all(isinstance(k, str) and k for k in spec.context)):
            return list(spec.context)
        return [f"output_{i}" for i in range(count)]

    def problem(self, node, op: str, why: str) -> None:
        where = _location(node, self.skip) if node is not None else ""
        self.problems.append((op, getattr(node, "name", "?"), where, why))
