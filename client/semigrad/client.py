"""gRPC client: register graphs, then evaluate them and their gradients."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import grpc
import numpy as np

from . import codec
from .errors import error_for_code, from_rpc_error
from .graph import Graph
from .specs import BestPath, OpInfo, SemiringInfo, TensorSpec
from .v1 import semigrad_pb2 as pb
from .v1 import semigrad_pb2_grpc as pb_grpc

DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024


class Client:
    """A connection to a semigrad server.

    ``target`` is "host:port". ``timeout`` is the deadline of every call in seconds (None: no
    deadline). ``max_message_bytes`` limits sent and received messages; ``options`` are extra
    gRPC channel options as (key, value) pairs and override the defaults; ``credentials``
    (grpc.ChannelCredentials) make a secure channel. Use as a context manager, or call close().
    Failed calls raise :class:`semigrad.SemigradError` subclasses.
    """

    def __init__(
        self,
        target: str,
        *,
        timeout: float | None = None,
        options: Iterable[tuple[str, object]] | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        credentials: grpc.ChannelCredentials | None = None,
    ):
        channel_options = {
            "grpc.max_send_message_length": max_message_bytes,
            "grpc.max_receive_message_length": max_message_bytes,
            **dict(options or ()),
        }
        channel_options = list(channel_options.items())
        if credentials is None:
            self._channel = grpc.insecure_channel(target, channel_options)
        else:
            self._channel = grpc.secure_channel(target, credentials, channel_options)
        self._stub = pb_grpc.GraphServiceStub(self._channel)
        self.timeout = timeout

    def register(self, graph: Graph | pb.Graph) -> RegisteredGraph:
        """Register ``graph`` (a Graph or a semigrad.v1.Graph); equal graphs get equal ids."""
        message = graph.to_proto() if isinstance(graph, Graph) else graph
        response = self._call("RegisterGraph", pb.RegisterGraphRequest(graph=message))
        return RegisteredGraph(self, response.graph_id, message, response.types,
                               created=response.created)

    def get_graph(self, graph_id: str) -> RegisteredGraph:
        """Bind to an already registered graph by id (NotFound if the server does not know it)."""
        response = self._call("GetGraph", pb.GetGraphRequest(graph_id=graph_id))
        return RegisteredGraph(self, response.graph_id, response.graph, response.types,
                               created=False)

    def list_ops(self) -> list[OpInfo]:
        """Describe every op the server supports."""
        response = self._call("ListOps", pb.ListOpsRequest())
        return [OpInfo.from_proto(op) for op in response.ops]

    def list_semirings(self) -> list[SemiringInfo]:
        """Every semiring plugin the server found, with its status (failed ones included)."""
        response = self._call("ListSemirings", pb.ListSemiringsRequest())
        return [SemiringInfo.from_proto(s) for s in response.semirings]

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _call(self, method: str, request):
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from error

    def _stream(self, method: str, requests):
        """Responses of a streaming call, errors of the call itself as SemigradError."""
        try:
            yield from getattr(self._stub, method)(requests, timeout=self.timeout)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from error


class RegisteredGraph:
    """A graph stored on the server.

    ``id`` is its content hash, ``graph`` its semigrad.v1.Graph, ``types`` maps every input name
    and node id to a :class:`TensorSpec` ``(shape, dtype)`` inferred by the server,
    ``input_specs`` and ``output_specs`` map input and output names to their TensorSpec, and
    ``created`` tells whether registering stored the graph (False if it already existed, or
    when bound with Client.get_graph).

    Input values and seeds may be ndarrays, lists or scalars: they are converted with np.asarray
    to the declared dtype, and may carry leading batch dimensions (results carry them too).
    Returned arrays are read-only views of the response bytes.
    """

    def __init__(self, client: Client, graph_id: str, graph: pb.Graph, types: Iterable[pb.NodeType],
                 *, created: bool):
        self.client = client
        self.id = graph_id
        self.graph = graph
        self.created = created
        self.types = {t.id: TensorSpec.from_proto(t) for t in types}
        self.input_specs = {i.name: TensorSpec.from_proto(i) for i in graph.inputs}
        self.output_specs = {o.name: self.types[o.node] for o in graph.outputs
                             if o.node in self.types}

    def __repr__(self) -> str:
        return f"RegisteredGraph({self.id!r}, inputs={list(self.input_specs)})"

    def evaluate(self, inputs: Mapping[str, object], outputs: str | Iterable[str] | None = None,
                 nodes: str | Iterable[str] | None = None, *, backend: str = "auto") -> dict[str, np.ndarray]:
        """Evaluate the graph and return ``{name: value}``.

        The dict holds the requested ``outputs`` (default: all) by output name and, if ``nodes``
        lists intermediate node ids, their values by node id. A node id that is also the name of
        a returned output raises ValueError. ``backend`` forces an execution backend ("tensor",
        "scalar", "jit"; default "auto" lets the server choose).
        """
        outputs, nodes = _names(outputs), _names(nodes)
        clashes = set(nodes) & set(outputs or (o.name for o in self.graph.outputs))
        if clashes:
            raise ValueError(f"node ids {sorted(clashes)} are also output names")
        request = pb.EvaluateRequest(graph_id=self.id, inputs=_encode(inputs, self.input_specs),
                                     outputs=outputs, nodes=nodes, backend=backend)
        response = self.client._call("Evaluate", request)
        return {**_decode(response.outputs), **_decode(response.nodes)}

    def gradient(self, inputs: Mapping[str, object], wrt: str | Iterable[str] | None = None,
                 seeds: Mapping[str, object] | None = None,
                 outputs: str | Iterable[str] | None = None, return_outputs: bool = False, *,
                 semiring: str = "real", semiring_params: Mapping[str, object] | None = None,
                 return_components: bool = False,
                 best_path: Iterable[tuple[str, Iterable[int]]] | None = None, backend: str = "auto"):
        """Gradients of the outputs with respect to inputs, as :class:`Gradients`
        (a dict ``{input name: gradient}``).

        ``wrt`` names the inputs (default: every floating input); ``outputs`` the outputs to
        differentiate (default: all); ``seeds`` maps output names to cotangents (default: the
        semiring's one, i.e. for "real" the gradient of the sum of all outputs; explicit seeds
        are lifted into the semiring). Each gradient is shaped like its input, batch dimensions
        included. With ``return_outputs=True`` returns ``(gradients, outputs)``, the latter the
        forward values of the differentiated outputs (also on ``gradients.outputs``).

        ``semiring`` (see :meth:`Client.list_semirings`) replaces the backward pass's
        arithmetic, ``semiring_params`` configures it (e.g. ``{"k": 5}`` for "kbest"). For a
        tuple-valued semiring the gradient is its primary component (entropy: H);
        ``return_components=True`` fills ``gradients.components[input][name]`` (entropy: Z, R).
        ``best_path`` lists ``(input name, full index)`` elements (batch dimensions first) whose
        best path a selective semiring traces into ``gradients.best_paths``. ``backend`` forces an
        execution backend ("tensor", "scalar", "jit"; default "auto").
        """
        request = self._gradient_request(inputs, wrt, seeds, outputs, return_outputs, semiring, semiring_params,
                                         return_components, best_path, backend)
        gradients = _gradients_from(self.client._call("Gradient", request))
        return (gradients, gradients.outputs) if return_outputs else gradients

    def gradient_many(self, inputs: Mapping[str, object], chunk_size: int = 1024, *, progress: bool | None = None,
                      **options) -> Gradients:
        """:meth:`gradient` for a large batch, streamed in chunks of ``chunk_size`` items along the
        first batch axis (one GradientStream call): the server works on one chunk while the next
        is on the wire, and no message grows with the batch. Takes the options of
        :meth:`gradient` (except ``best_path``) and returns the reassembled :class:`Gradients`.
        ``progress``: show a tqdm progress bar (default: when tqdm is installed and there are
        more than 8 chunks). A failing chunk does not stop the others; afterwards the first
        failure is raised, naming every failed chunk.
        """
        if chunk_size < 1:
            raise ValueError("chunk_size must be at least 1")
        arrays = {name: np.asarray(value, dtype=self.input_specs[name].dtype if name in self.input_specs else None)
                  for name, value in inputs.items()}
        batched = {name for name, a in arrays.items()
                   if name in self.input_specs and a.ndim > len(self.input_specs[name].shape)}
        sizes = {arrays[name].shape[0] for name in batched}
        if len(sizes) > 1:
            raise ValueError(f"batched inputs disagree on the first batch axis: {sorted(sizes)}")
        total = sizes.pop() if sizes else 1
        seeds = options.pop("seeds", None) or {}
        starts = list(range(0, total, chunk_size))

        def cut(values: Mapping[str, np.ndarray], specs, start: int):
            return {name: a[start:start + chunk_size] if _has_batch(a, specs.get(name)) and batched else a
                    for name, a in values.items()}

        seed_arrays = {name: np.asarray(v) for name, v in seeds.items()}

        def requests():
            for k, start in enumerate(starts):
                yield pb.GradientStreamRequest(chunk=k, request=self._gradient_request(
                    cut(arrays, self.input_specs, start), seeds=cut(seed_arrays, self.output_specs, start), **options))

        parts: list[Gradients | None] = [None] * len(starts)
        failures = []
        responses = self.client._stream("GradientStream", requests())
        if progress or (progress is None and len(starts) > 8):
            responses = _progress(responses, len(starts))
        for message in responses:
            if message.code:
                failures.append((message.chunk, message.code, message.message))
            else:
                parts[message.chunk] = _gradients_from(message.response)
        if failures:
            chunk, code, text = failures[0]
            listed = ", ".join(str(c) for c, _, _ in failures)
            raise error_for_code(code, f"chunk {chunk} (items {chunk * chunk_size}..): {text} "
                                       f"[failed chunks: {listed} of {len(starts)}]")
        return _concatenate(parts, batched=bool(batched))

    def _gradient_request(self, inputs, wrt=None, seeds=None, outputs=None, return_outputs=False,
                          semiring="real", semiring_params=None, return_components=False, best_path=None,
                          backend="auto") -> pb.GradientRequest:
        return pb.GradientRequest(
            graph_id=self.id, inputs=_encode(inputs, self.input_specs), wrt=_names(wrt),
            seeds=_encode(seeds or {}, self.output_specs), outputs=_names(outputs),
            return_outputs=return_outputs, semiring=semiring,
            semiring_params={k: codec.attr_value(v) for k, v in (semiring_params or {}).items()},
            return_components=return_components,
            best_paths=[pb.ElementRef(input=name, index=[int(i) for i in index]) for name, index in best_path or ()],
            backend=backend,
        )


def _gradients_from(response: pb.GradientResponse) -> Gradients:
    gradients = Gradients(_decode(response.gradients))
    gradients.outputs = _decode(response.outputs)
    gradients.components = {x: _decode(parts.tensors) for x, parts in response.components.items()}
    gradients.best_paths = [BestPath.from_proto(p) for p in response.best_paths]
    return gradients


def _has_batch(value: np.ndarray, spec: TensorSpec | None) -> bool:
    return spec is not None and value.ndim > len(spec.shape)


def _concatenate(parts: list[Gradients], batched: bool) -> Gradients:
    if not batched:
        return parts[0]
    join = lambda dicts: {k: np.concatenate([d[k] for d in dicts]) for k in dicts[0]}  # noqa: E731
    result = Gradients(join(parts))
    result.outputs = join([p.outputs for p in parts]) if parts[0].outputs else {}
    result.components = {x: join([p.components[x] for p in parts]) for x in parts[0].components}
    result.best_paths = []
    return result


def _progress(responses, total: int):
    try:
        from tqdm import tqdm
    except ImportError:  # the progress bar is optional
        return responses
    return tqdm(responses, total=total, unit="chunk", desc="semigrad")


class Gradients(dict):
    """``{input name: gradient}``, plus what else a gradient call returned: ``outputs``
    (forward values, when asked), ``components`` (``{input: {component: array}}`` for tuple
    semirings, when asked) and ``best_paths`` (a list of :class:`BestPath`)."""

    outputs: dict[str, np.ndarray]
    components: dict[str, dict[str, np.ndarray]]
    best_paths: list[BestPath]



def _names(names: str | Iterable[str] | None) -> list[str]:
    if names is None:
        return []
    return [names] if isinstance(names, str) else list(names)


def _encode(values: Mapping[str, object], specs: Mapping[str, TensorSpec]) -> dict[str, pb.Tensor]:
    """Encode ``values`` by name in their spec's dtype (unknown names: for the server to reject)."""
    return {name: codec.to_tensor(value, specs[name].dtype if name in specs else None)
            for name, value in values.items()}


def _decode(tensors: Mapping[str, pb.Tensor]) -> dict[str, np.ndarray]:
    return {name: codec.from_tensor(tensor) for name, tensor in tensors.items()}
