"""The RPC surface: a Client registers graphs and lists what the server offers; a
RegisteredGraph evaluates a graph, its gradients and its descriptions. How calls travel is
transport.py's job, gradient_many's chunks streaming.py's, hooks run here hook_stream.py's."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import grpc
import numpy as np

from . import messages, streaming
from .description import GraphDescription
from .graph import Graph
from .hook_stream import gradient_with_client_hooks
from .hooks import attachments
from .local import LocalTransport
from .messages import Gradients
from .reports import CrossCheckReport, SymbolicGradient
from .specs import OpInfo, SemiringInfo, TensorSpec
from .transport import DEFAULT_MAX_MESSAGE_BYTES, SHARED_MEMORY_THRESHOLD, Transport, fill, tls_credentials
from .v1 import semigrad_pb2 as pb
from .viz import render_dot

__all__ = ["Client", "Gradients", "RegisteredGraph"]


class _OnTransport:
    """A Client attribute kept by its transport (readable and writable as before the split)."""

    def __set_name__(self, owner, name: str):
        self.name = name

    def __get__(self, client, owner=None):
        return self if client is None else getattr(client.transport, self.name)

    def __set__(self, client, value) -> None:
        setattr(client.transport, self.name, value)


class Client:
    """The semigrad engine: in this process, or a server's.

    ``Client()`` without a ``target`` runs the engine in this process (no server, no sockets;
    needs the full ``semigrad`` install, as it imports the server package); ``Client("host:port")``
    talks to a server (or, with a gRPC name such as "dns:///semigrad.example:50051", to every
    address it resolves to, balanced call by call: round_robin, see docs/deploying.md). Both take the same calls and give the same results, errors (class, status
    code and message), hooks, streams and reports. ``timeout`` is the deadline of every call in
    seconds (None: no deadline); in this process an answer found after the deadline is refused
    with DeadlineExceeded too, as gRPC refuses it. ``limits`` (a semigrad_server.limits.Limits)
    sets the in-process engine's request limits (a server's are options of ``semigrad serve``).

    The rest are a server connection's: ``max_message_bytes`` limits sent and received
    messages; ``options`` are extra gRPC channel options as (key, value) pairs and override the
    defaults; ``credentials`` (grpc.ChannelCredentials) make a secure channel. Use as a context
    manager, or call close(). Failed calls raise :class:`semigrad.SemigradError` subclasses.
    ``token`` (default ``$SEMIGRAD_TOKEN``) is sent as ``authorization: Bearer`` when the server
    requires one; ``tls``, ``root_certificates``, ``private_key`` and ``certificate_chain`` make a TLS or
    mutual-TLS channel.

    ``token``: the bearer token sent with every call (metadata ``authorization: Bearer ...``) to
    a server with authentication; default ``$SEMIGRAD_TOKEN``. ``tls=True`` makes a TLS channel
    trusting ``root_certificates`` (PEM bytes or a file path; None: the system's roots); give
    ``private_key`` and ``certificate_chain`` too for mutual TLS (any of them implies TLS).

    ``shared_memory``: pass the tensors of evaluate, gradient and gradient_many calls through
    POSIX shared memory (/dev/shm) instead of the message, for a server on this host running as
    this user. ``"auto"`` (default) does so when the target is a unix socket, localhost or a
    loopback address and a call moves at least ``shared_memory_threshold`` bytes of tensors, and
    stops for good (sending inline, the failed call retried) the first time the server refuses
    (another host or container, another user, ``--no-shared-memory``); ``True`` always, a refusal
    raising FailedPrecondition; ``False`` never. Results that came through shared memory are
    writable arrays viewing the call's region (no copy), which goes back to the client's pool
    only once they are garbage-collected. ``close()`` removes the client's regions (arrays still
    held stay readable). See docs/performance.md.
    """

    timeout = _OnTransport()
    shared_memory = _OnTransport()
    shared_memory_threshold = _OnTransport()
    shared_memory_off = _OnTransport()  # why "auto" stopped using shared memory (None while it may)

    def __init__(
        self,
        target: str | None = None,
        *,
        timeout: float | None = None,
        options: Iterable[tuple[str, object]] | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        credentials: grpc.ChannelCredentials | None = None,
        shared_memory: bool | str = "auto",
        shared_memory_threshold: int = SHARED_MEMORY_THRESHOLD,
        limits=None,
        token: str | None = None,
        tls: bool = False,
        root_certificates: bytes | str | None = None,
        private_key: bytes | str | None = None,
        certificate_chain: bytes | str | None = None,
    ):
        connection_only = (options or credentials is not None or shared_memory is True or token is not None or tls
                           or root_certificates is not None or private_key is not None
                           or certificate_chain is not None)
        if target is None:
            if connection_only:
                raise ValueError("options, credentials, token, TLS and shared_memory=True are a server "
                                 "connection's: Client() without an address runs the engine in this process")
            self.transport = LocalTransport(timeout=timeout, limits=limits)
            return
        if limits is not None:
            raise ValueError("limits= sets the in-process engine's limits; a server's are options of "
                             "`semigrad serve`")
        if credentials is None and (tls or root_certificates is not None or private_key is not None
                                    or certificate_chain is not None):
            credentials = tls_credentials(root_certificates, private_key, certificate_chain)
        self.transport = Transport(target, timeout=timeout, options=options, max_message_bytes=max_message_bytes,
                                   credentials=credentials, shared_memory=shared_memory,
                                   shared_memory_threshold=shared_memory_threshold,
                                   token=token if token is not None else os.environ.get("SEMIGRAD_TOKEN") or None)

    def register(self, graph: Graph | pb.Graph) -> RegisteredGraph:
        """Register ``graph`` (a Graph or a semigrad.v1.Graph); equal graphs get equal ids."""
        message = graph.to_proto() if isinstance(graph, Graph) else graph
        response = self.transport.call("RegisterGraph", pb.RegisterGraphRequest(graph=message))
        return RegisteredGraph(self, response.graph_id, message, response.types,
                               created=response.created, custom_ops=response.custom_ops)

    def get_graph(self, graph_id: str) -> RegisteredGraph:
        """Bind to an already registered graph by id (NotFound if the server does not know it)."""
        response = self.transport.call("GetGraph", pb.GetGraphRequest(graph_id=graph_id))
        return RegisteredGraph(self, response.graph_id, response.graph, response.types,
                               created=False, custom_ops=response.custom_ops)

    def delete_graph(self, graph_id: str) -> bool:
        """Forget this caller's registration of ``graph_id`` (other tenants' registrations of the
        same graph stay); True when there was one. Deleting twice is not an error."""
        return self.transport.call("DeleteGraph", pb.DeleteGraphRequest(graph_id=graph_id)).deleted

    def list_ops(self) -> list[OpInfo]:
        """Describe every op the server supports."""
        response = self.transport.call("ListOps", pb.ListOpsRequest())
        return [OpInfo.from_proto(op) for op in response.ops]

    def list_hooks(self) -> list[dict]:
        """Every server-side hook (built-in and plugin): name, description, parameters, status."""
        response = self.transport.call("ListHooks", pb.ListHooksRequest())
        return [{"name": h.name, "description": h.description, "parameters": dict(h.parameters),
                 "distribution": h.distribution, "status": h.status, "error": h.error} for h in response.hooks]

    def list_semirings(self) -> list[SemiringInfo]:
        """Every semiring plugin the server found, with its status (failed ones included)."""
        response = self.transport.call("ListSemirings", pb.ListSemiringsRequest())
        return [SemiringInfo.from_proto(s) for s in response.semirings]

    @property
    def in_process(self) -> bool:
        """Whether the engine runs in this process (a Client made without an address)."""
        return isinstance(self.transport, LocalTransport)

    def close(self) -> None:
        """Close the channel and remove the client's shared-memory regions (in process: nothing)."""
        self.transport.close()

    def shared_memory_regions(self) -> list[str]:
        """Names of the client's shared-memory regions (files in /dev/shm) now."""
        return self.transport.regions()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class RegisteredGraph:
    """A graph stored on the server.

    ``id`` is its content hash, ``graph`` its semigrad.v1.Graph, ``types`` maps every input name
    and node id to a :class:`TensorSpec` ``(shape, dtype)`` inferred by the server,
    ``input_specs`` and ``output_specs`` map input and output names to their TensorSpec, and
    ``created`` tells whether registering stored the graph (False if it already existed, or
    when bound with Client.get_graph).

    Input values and seeds may be ndarrays, lists or scalars: they are converted to the declared
    dtype, and may carry leading batch dimensions (results carry them too). A conversion that
    would change a value (2.7 or 1e30 into int64, 2 into bool, strings) raises InvalidArgument
    naming the input, both dtypes and the first element at fault; see :func:`semigrad.codec.cast`.
    Returned arrays are read-only views of the response bytes, or, for calls that went through
    shared memory (see :class:`Client`), writable arrays of their own.
    """

    def __init__(self, client: Client, graph_id: str, graph: pb.Graph, types: Iterable[pb.NodeType],
                 *, created: bool, custom_ops: Iterable[pb.OpInfo] = ()):
        self.client = client
        self.id = graph_id
        self.graph = graph
        self.created = created
        self.types = {t.id: TensorSpec.from_proto(t) for t in types}
        self.input_specs = {i.name: TensorSpec.from_proto(i) for i in graph.inputs}
        self.output_specs = {o.name: self.types[o.node] for o in graph.outputs
                             if o.node in self.types}
        # The graph's custom ops as the server describes them (expression, derivative formulas).
        self.custom_ops = {op.name: OpInfo.from_proto(op) for op in custom_ops}
        # gradient_many: the most items per chunk the server's limits allowed, by request shape
        # (learned from refused chunks, see streaming.py)
        self.chunk_limits: dict = {}

    def delete(self) -> bool:
        """Forget this registration on the server (see :meth:`Client.delete_graph`)."""
        return self.client.delete_graph(self.id)

    def crosscheck(self, inputs: Mapping[str, object], wrt: str | Iterable[str] | None = None,
                   outputs: str | Iterable[str] | None = None, *, methods: Iterable[str] | None = None,
                   atol: float | None = None, rtol: float | None = None, step: float | None = None,
                   richardson: bool = False, semiring: str = "real",
                   semiring_params: Mapping[str, object] | None = None, localize: bool = False) -> CrossCheckReport:
        """Compare the server's reverse-mode derivatives with other ways to them, at one point.

        ``inputs`` gives every input with its declared shape (no batch dimensions). With the
        real semiring the full Jacobian of each (output, ``wrt`` input) pair is computed by
        reverse mode, symbolically (SymPy), by central finite differences (``step`` relative,
        default 6e-6; ``richardson=True`` extrapolates) and, when every op is analytic, by the
        complex step; ``methods`` picks some of "reverse", "symbolic", "finite_difference",
        "complex_step". With another ``semiring`` the backward pass's path sums are compared
        with brute-force path enumeration ("reverse", "path_enumeration").

        Elements pass when |a - b| <= atol + rtol·|b| (defaults 1e-5 and 1e-3, as
        torch.autograd.gradcheck). When a comparison fails (or with ``localize=True``) every
        node's local derivative rule is checked against finite differences of that node alone,
        and ``report.suspects`` names the nodes whose rule disagrees. Returns a
        :class:`CrossCheckReport`; ``print(report)`` shows it.
        """
        request = pb.CrossCheckRequest(
            graph_id=self.id, inputs=messages.encode(inputs, self.input_specs), wrt=messages.names(wrt),
            outputs=messages.names(outputs), methods=messages.names(methods), richardson=richardson,
            semiring=semiring, localize=localize,
            semiring_params=messages.attr_values(semiring_params))
        for field_name, value in (("atol", atol), ("rtol", rtol), ("step", step)):
            if value is not None:
                setattr(request, field_name, float(value))
        return CrossCheckReport.from_proto(self.client.transport.call("CrossCheck", request))

    def symbolic_gradient(self, wrt: str | Iterable[str] | None = None, outputs: str | Iterable[str] | None = None,
                          *, simplify: bool = True) -> SymbolicGradient:
        """Every derivative of the outputs (default: every float output) with respect to every
        element of the ``wrt`` inputs (default: every float input), as formulas: text, LaTeX and
        stand-alone Python source. See :class:`SymbolicGradient`."""
        request = pb.SymbolicGradientRequest(graph_id=self.id, wrt=messages.names(wrt),
                                             outputs=messages.names(outputs), no_simplify=not simplify)
        return SymbolicGradient.from_proto(self.client.transport.call("SymbolicGradient", request))

    def describe(self, semiring: str = "real", wrt: str | Iterable[str] | None = None, *,
                 outputs: str | Iterable[str] | None = None,
                 semiring_params: Mapping[str, object] | None = None) -> GraphDescription:
        """Every input and node: op, inputs (its next functions), consumers, inferred type, leaf /
        requires-gradient (w.r.t. ``wrt``, default every float input) and derivative rules as
        formulas of the node ids; and the backward graph reverse mode generates for ``semiring``,
        ``wrt`` and ``outputs`` (default every float output). See :class:`GraphDescription`."""
        request = pb.DescribeGraphRequest(
            graph_id=self.id, semiring=semiring, wrt=messages.names(wrt), outputs=messages.names(outputs),
            semiring_params=messages.attr_values(semiring_params))
        return GraphDescription.from_proto(self.client.transport.call("DescribeGraph", request))

    def to_dot(self, values: Mapping[str, object] | None = None, gradients: Mapping[str, object] | None = None,
               highlight_path=None, inputs: Mapping[str, object] | None = None, semiring: str = "real", *,
               wrt: str | Iterable[str] | None = None, semiring_params: Mapping[str, object] | None = None) -> str:
        """The graph as Graphviz DOT text (drawn by the server): each node labelled with id, op,
        shape and dtype, inputs as leaves, outputs marked.

        With ``inputs`` the server evaluates every node there and labels it with a summary of its
        value and of its gradient (of the float outputs' sum, under ``semiring``, w.r.t. ``wrt``).
        ``values`` and ``gradients`` (``{node or input id: array}``) are shown as given, over the
        computed ones. ``highlight_path`` draws a path in red: a :class:`BestPath` or a sequence of
        ``(node id, element index)`` pairs.
        """
        request = pb.DrawGraphRequest(
            graph_id=self.id, inputs=messages.encode(inputs or {}, self.input_specs), semiring=semiring,
            wrt=messages.names(wrt), semiring_params=messages.attr_values(semiring_params),
            values=messages.encode(values or {}, self.types, "value of"), gradients=messages.encode(gradients or {}, {}, "gradient of"),
            highlight=messages.path_elements(highlight_path))
        return self.client.transport.call("DrawGraph", request).dot

    def render(self, path: str | Path, *, format: str | None = None, **options) -> Path:
        """Draw the graph into ``path`` (``format`` from its suffix: .svg, .png, .pdf, ...) with the
        graphviz Python package (``pip install 'semigrad[viz]'``) and Graphviz's dot program;
        ``options`` are those of :meth:`to_dot`. Returns the path."""
        return render_dot(self.to_dot(**options), path, format)

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
        outputs, nodes = messages.names(outputs), messages.names(nodes)
        clashes = set(nodes) & set(outputs or (o.name for o in self.graph.outputs))
        if clashes:
            raise ValueError(f"node ids {sorted(clashes)} are also output names")
        arrays = messages.arrays(inputs, self.input_specs)
        transport = self.client.transport
        if type(transport) is LocalTransport and arrays.keys() <= self.input_specs.keys():
            values = transport.evaluate(self.id, arrays, tuple(outputs), tuple(nodes), backend)
            if values is not None:
                return values
        request = pb.EvaluateRequest(graph_id=self.id, outputs=outputs, nodes=nodes, backend=backend)
        returned = [*(outputs or (o.name for o in self.graph.outputs)), *nodes]
        expected = lambda: messages.result_bytes(  # noqa: E731
            self, arrays, [self.output_specs.get(n) or self.types.get(n) for n in returned])
        return self.client.transport.tensor_call(
            "Evaluate", request, {"inputs": arrays}, expected,
            lambda response, read: {**messages.decode(response.outputs, read), **messages.decode(response.nodes, read)})

    def gradient(self, inputs: Mapping[str, object], wrt: str | Iterable[str] | None = None,
                 seeds: Mapping[str, object] | None = None,
                 outputs: str | Iterable[str] | None = None, return_outputs: bool = False, *,
                 semiring: str | Iterable[str] = "real", semiring_params: Mapping[str, object] | None = None,
                 return_components: bool = False,
                 best_path: Iterable[tuple[str, Iterable[int]]] | str | None = None, backend: str = "auto",
                 retain: str | Iterable[str] | None = None, hooks: Mapping[str, object] | None = None,
                 top_paths: int = 0):
        """Gradients of the outputs with respect to inputs, as :class:`Gradients`
        (a dict ``{input name: gradient}``).

        ``wrt`` names the inputs (default: every floating input); ``outputs`` the outputs to
        differentiate (default: every floating output); ``seeds`` maps output names to cotangents (default: the
        semiring's one, i.e. for "real" the gradient of the sum of those outputs; explicit seeds
        are lifted into the semiring). Each gradient is shaped like its input, batch dimensions
        included. With ``return_outputs=True`` returns ``(gradients, outputs)``, the latter the
        forward values of the differentiated outputs (also on ``gradients.outputs``).

        ``semiring`` (see :meth:`Client.list_semirings`) replaces the backward pass's
        arithmetic, ``semiring_params`` configures it (e.g. ``{"k": 5}`` for "kbest"). For a
        tuple-valued semiring the gradient is its primary component (entropy: H);
        ``return_components=True`` fills ``gradients.components[input][name]`` (entropy: Z, R).
        ``best_path`` lists ``(input name, full index)`` elements (batch dimensions first) whose
        best path a selective semiring traces into ``gradients.best_paths``; ``best_path="all"``
        asks for every element of every ``wrt`` input (input by input, elements in row-major
        order of their full index). ``top_paths=k`` returns the k best paths of the whole graph
        (over every element of every ``wrt`` input), best first, in ``gradients.best_paths``.
        Paths are read from back-pointers the backward pass records (docs/semirings.md; at most
        ``max_path_steps`` steps in one answer, docs/limits.md). ``backend`` forces an
        execution backend ("tensor", "scalar", "jit"; default "auto").

        ``semiring`` may be a list of names (``["real", "max_product", "entropy"]``): one
        forward pass and one backward walk compute all of them, and the call returns a
        :class:`SemiringGradients`, ``{name: Gradients}``; ``semiring_params`` then maps a
        semiring's name to its parameters (``{"kbest": {"k": 5}}``). Not with ``best_path``.

        ``retain`` names intermediate nodes whose gradients come back in ``gradients.retained``.
        ``hooks`` maps node ids to hooks (see :mod:`semigrad.hooks`): callables and
        :class:`PreHook` run here, in this process, while the server waits;
        :class:`ServerHook` runs on the server; what "record" hooks saw is in
        ``gradients.records``.
        """
        transport = self.client.transport
        semiring = semiring if isinstance(semiring, str) else tuple(semiring)  # (read once: any iterable)
        if (type(transport) is LocalTransport and not hooks and semiring
                and (isinstance(semiring, str) or all(type(name) is str for name in semiring))  # else: refused as remotely
                and not (seeds or semiring_params or return_components or best_path or retain or top_paths)):
            arrays = messages.arrays(inputs, self.input_specs)
            if arrays.keys() <= self.input_specs.keys():  # (the hot path: no messages)
                result = transport.gradient(
                    self.id, arrays, (wrt,) if isinstance(wrt, str) else tuple(wrt) if wrt else (),
                    (outputs,) if isinstance(outputs, str) else tuple(outputs) if outputs else (), return_outputs,
                    backend, semiring)
                if result is not None:
                    if isinstance(semiring, str):
                        gradients = _gradients(result[0])
                    else:  # several semirings: each one's gradients, as a response's parts decode
                        gradients = messages.SemiringGradients({name: _gradients(part) for name, part in result[0].items()})
                    gradients.outputs = result[1]
                    return (gradients, gradients.outputs) if return_outputs else gradients
        wire, local = attachments(hooks)
        request, tensors = messages.gradient_request(self, inputs, wrt, seeds, outputs, return_outputs, semiring,
                                                     semiring_params, return_components, best_path, backend,
                                                     retain, wire, top_paths)
        if local:
            fill(request, tensors, None)
            gradients = gradient_with_client_hooks(self.client.transport, request, local)
        else:
            gradients = self.client.transport.tensor_call(
                "Gradient", request, tensors,
                lambda: messages.gradient_result_bytes(self, request, tensors["inputs"]), messages.gradients_from)
        if isinstance(gradients, messages.SemiringGradients):  # a message's map has no order: the request's
            gradients = gradients.ordered(request.semirings)
        return (gradients, gradients.outputs) if return_outputs else gradients

    def gradient_many(self, inputs: Mapping[str, object], chunk_size: int | None = None, *,
                      progress: bool | None = None, streams: int = 1, **options) -> Gradients:
        """:meth:`gradient` for a large batch, streamed in chunks of ``chunk_size`` items along the
        first batch axis (one GradientStream call): the server works on one chunk while the next
        is on the wire, and no message grows with the batch. ``chunk_size=None`` (default) makes
        chunks of nearly equal size holding at most about 64 MiB of tensors (inputs and results)
        through shared memory, 2 MiB inline; a batch of at most 4 such chunks is one Gradient call,
        which costs less than a stream. Chunks never carry more items than the server's limits allow
        (a chunk it refuses for its item count goes again, cut to what it says fits). Takes the options of :meth:`gradient` (except
        ``best_path`` and ``hooks``) and returns the reassembled :class:`Gradients`.
        ``progress``: show a tqdm progress bar (default: when tqdm is installed and there are
        more than 8 chunks). A failing chunk does not stop the others; afterwards the first
        failure is raised, naming every failed chunk. ``streams``: carry the chunks over this many
        GradientStream calls at once (chunk k on call k mod streams; with ``chunk_size=None`` at
        least one chunk per call), so a load balancer or the client's round-robin over replicas
        spreads one job over several replicas (docs/deploying.md); progress is shown for one stream only.
        """
        return streaming.gradient_many(self, inputs, chunk_size, progress, options, streams)


def _gradients(arrays: dict) -> Gradients:
    """Gradients alone, as a response holding nothing else decodes."""
    gradients = Gradients(arrays)
    gradients.outputs, gradients.components, gradients.best_paths, gradients.retained, gradients.records = (
        {}, {}, [], {}, {})
    return gradients
