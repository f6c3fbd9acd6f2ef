"""gRPC client: register graphs, then evaluate them and their gradients."""

from __future__ import annotations

import functools
import math
import queue
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import grpc
import numpy as np

from . import codec
from .description import GraphDescription
from .errors import FailedPrecondition, InvalidArgument, SemigradError, error_for_code, from_rpc_error
from .hooks import Contribution, attachments
from .graph import Graph
from .reports import CrossCheckReport, SymbolicGradient
from .shared_memory import Placement, RegionPool, is_local_target, tensor_bytes
from .shared_memory import available as shared_memory_available
from .specs import BestPath, OpInfo, PathStep, SemiringInfo, TensorSpec
from .viz import render_dot
from .v1 import semigrad_pb2 as pb
from .v1 import semigrad_pb2_grpc as pb_grpc

DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 * 1024
# HTTP/2 and TCP tuning for large messages: none; see TRANSPORT_OPTIONS in
# semigrad_server/service/server.py for what was measured (nothing beat the noise).
TRANSPORT_OPTIONS: tuple[tuple[str, object], ...] = ()
# shared_memory="auto": a call's tensors (request and expected response) from this many bytes
# on go through shared memory. Measured crossover on loopback: see docs/performance.md.
SHARED_MEMORY_THRESHOLD = 128 * 1024
STREAM_REGIONS = 4  # shared-memory regions one GradientStream keeps in flight (chunks on the wire)
# gradient_many's default chunk: about this many bytes of tensors (inputs and results). Measured
# on loopback (bench/stream_chunks.py): through shared memory a chunk costs ~1 ms on top of its
# compute and moves nothing, so chunks are large; inline, encoding, the wire and decoding overlap
# best around 1-2 MiB (larger messages slow down).
STREAM_CHUNK_BYTES_SHARED = 64 << 20
STREAM_CHUNK_BYTES_INLINE = 2 << 20


class Client:
    """A connection to a semigrad server.

    ``target`` is "host:port". ``timeout`` is the deadline of every call in seconds (None: no
    deadline). ``max_message_bytes`` limits sent and received messages; ``options`` are extra
    gRPC channel options as (key, value) pairs and override the defaults; ``credentials``
    (grpc.ChannelCredentials) make a secure channel. Use as a context manager, or call close().
    Failed calls raise :class:`semigrad.SemigradError` subclasses.

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

    def __init__(
        self,
        target: str,
        *,
        timeout: float | None = None,
        options: Iterable[tuple[str, object]] | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        credentials: grpc.ChannelCredentials | None = None,
        shared_memory: bool | str = "auto",
        shared_memory_threshold: int = SHARED_MEMORY_THRESHOLD,
    ):
        if shared_memory not in ("auto", True, False):
            raise ValueError(f"shared_memory must be 'auto', True or False, not {shared_memory!r}")
        if shared_memory is True and not shared_memory_available():
            raise ValueError("shared_memory=True needs a writable /dev/shm on this host")
        self.shared_memory = shared_memory
        self.shared_memory_threshold = shared_memory_threshold
        # Why "auto" stopped using shared memory (None while it may).
        self.shared_memory_off: str | None = None
        if shared_memory == "auto" and not (is_local_target(target) and shared_memory_available()):
            self.shared_memory_off = "the target is not on this host" if shared_memory_available() \
                else "no writable /dev/shm"
        elif shared_memory is False:
            self.shared_memory_off = "shared_memory=False"
        self._pool: RegionPool | None = None
        self._pool_lock = threading.Lock()
        # Gives a call's region back; held by lent results, so it must not keep the client alive.
        self._release = _releaser(weakref.ref(self))
        channel_options = {
            "grpc.max_send_message_length": max_message_bytes,
            "grpc.max_receive_message_length": max_message_bytes,
            **dict(TRANSPORT_OPTIONS),
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
                               created=response.created, custom_ops=response.custom_ops)

    def get_graph(self, graph_id: str) -> RegisteredGraph:
        """Bind to an already registered graph by id (NotFound if the server does not know it)."""
        response = self._call("GetGraph", pb.GetGraphRequest(graph_id=graph_id))
        return RegisteredGraph(self, response.graph_id, response.graph, response.types,
                               created=False, custom_ops=response.custom_ops)

    def list_ops(self) -> list[OpInfo]:
        """Describe every op the server supports."""
        response = self._call("ListOps", pb.ListOpsRequest())
        return [OpInfo.from_proto(op) for op in response.ops]

    def list_hooks(self) -> list[dict]:
        """Every server-side hook (built-in and plugin): name, description, parameters, status."""
        response = self._call("ListHooks", pb.ListHooksRequest())
        return [{"name": h.name, "description": h.description, "parameters": dict(h.parameters),
                 "distribution": h.distribution, "status": h.status, "error": h.error} for h in response.hooks]

    def list_semirings(self) -> list[SemiringInfo]:
        """Every semiring plugin the server found, with its status (failed ones included)."""
        response = self._call("ListSemirings", pb.ListSemiringsRequest())
        return [SemiringInfo.from_proto(s) for s in response.semirings]

    def close(self) -> None:
        """Close the channel and remove the client's shared-memory regions."""
        self._channel.close()
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def shared_memory_regions(self) -> list[str]:
        """Names of the client's shared-memory regions (files in /dev/shm) now."""
        with self._pool_lock:
            return self._pool.names() if self._pool is not None else []

    def _placement(self, tensors: Mapping[str, Mapping[str, np.ndarray]],
                   result_bytes: Callable[[], int]) -> Placement | None:
        """A region of its own for a call moving `tensors` and about `result_bytes()` of results,
        or None to send them inline."""
        if self.shared_memory_off is not None:
            return None
        nbytes = sum(tensor_bytes(a) for a in tensors.values()) + result_bytes()
        if self.shared_memory == "auto" and nbytes < self.shared_memory_threshold:
            return None
        with self._pool_lock:
            if self._pool is None:
                self._pool = RegionPool()
            pool = self._pool
        try:
            return Placement(pool.acquire(nbytes))
        except (OSError, ValueError):  # /dev/shm full, or closed meanwhile: inline this time
            if self.shared_memory is True:
                raise
            return None

    def _give_back(self, region) -> None:
        """A call's region back to the pool (or removed, when the client was closed meanwhile)."""
        with self._pool_lock:
            pool = self._pool
        if pool is not None:
            pool.release(region)
        else:
            region.close()

    def _refused(self, error: SemigradError) -> bool:
        """In "auto" mode, a refusal of shared memory switches it off (True: retry inline)."""
        if (self.shared_memory == "auto" and isinstance(error, FailedPrecondition)
                and "shared memory" in error.message):
            self.shared_memory_off = f"the server refused it: {error.message}"
            return True
        return False

    def _tensor_call(self, method: str, request, tensors: Mapping[str, Mapping[str, np.ndarray]],
                     result_bytes: Callable[[], int], decode: Callable):
        """Call unary `method` with `tensors` ({request field: {name: array}}) inline or in shared
        memory; `decode(response, read)` builds the result, shared tensors lent (see Placement.lend)."""
        placement = self._placement(tensors, result_bytes)
        if placement is not None:
            try:
                _fill(request, tensors, placement)
                try:
                    return decode(self._call(method, request), placement.lend)
                except FailedPrecondition as error:
                    if not self._refused(error):
                        raise
            finally:
                placement.finish(self._release)
            request.ClearField("output_region")
        _fill(request, tensors, None)
        return decode(self._call(method, request), codec.from_tensor)

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
            graph_id=self.id, inputs=_encode(inputs, self.input_specs), wrt=_names(wrt), outputs=_names(outputs),
            methods=_names(methods), richardson=richardson, semiring=semiring, localize=localize,
            semiring_params={k: codec.attr_value(v) for k, v in (semiring_params or {}).items()})
        for field_name, value in (("atol", atol), ("rtol", rtol), ("step", step)):
            if value is not None:
                setattr(request, field_name, float(value))
        return CrossCheckReport.from_proto(self.client._call("CrossCheck", request))

    def symbolic_gradient(self, wrt: str | Iterable[str] | None = None, outputs: str | Iterable[str] | None = None,
                          *, simplify: bool = True) -> SymbolicGradient:
        """Every derivative of the outputs (default: every float output) with respect to every
        element of the ``wrt`` inputs (default: every float input), as formulas: text, LaTeX and
        stand-alone Python source. See :class:`SymbolicGradient`."""
        request = pb.SymbolicGradientRequest(graph_id=self.id, wrt=_names(wrt), outputs=_names(outputs),
                                             no_simplify=not simplify)
        return SymbolicGradient.from_proto(self.client._call("SymbolicGradient", request))

    def describe(self, semiring: str = "real", wrt: str | Iterable[str] | None = None, *,
                 outputs: str | Iterable[str] | None = None,
                 semiring_params: Mapping[str, object] | None = None) -> GraphDescription:
        """Every input and node: op, inputs (its next functions), consumers, inferred type, leaf /
        requires-gradient (w.r.t. ``wrt``, default every float input) and derivative rules as
        formulas of the node ids; and the backward graph reverse mode generates for ``semiring``,
        ``wrt`` and ``outputs`` (default every float output). See :class:`GraphDescription`."""
        request = pb.DescribeGraphRequest(
            graph_id=self.id, semiring=semiring, wrt=_names(wrt), outputs=_names(outputs),
            semiring_params={k: codec.attr_value(v) for k, v in (semiring_params or {}).items()})
        return GraphDescription.from_proto(self.client._call("DescribeGraph", request))

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
            graph_id=self.id, inputs=_encode(inputs or {}, self.input_specs), semiring=semiring, wrt=_names(wrt),
            semiring_params={k: codec.attr_value(v) for k, v in (semiring_params or {}).items()},
            values=_encode(values or {}, self.types, "value of"), gradients=_encode(gradients or {}, {}),
            highlight=_path_elements(highlight_path))
        return self.client._call("DrawGraph", request).dot

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
        outputs, nodes = _names(outputs), _names(nodes)
        clashes = set(nodes) & set(outputs or (o.name for o in self.graph.outputs))
        if clashes:
            raise ValueError(f"node ids {sorted(clashes)} are also output names")
        arrays = _arrays(inputs, self.input_specs)
        request = pb.EvaluateRequest(graph_id=self.id, outputs=outputs, nodes=nodes, backend=backend)
        returned = [*(outputs or (o.name for o in self.graph.outputs)), *nodes]
        expected = lambda: self._result_bytes(  # noqa: E731
            arrays, [self.output_specs.get(n) or self.types.get(n) for n in returned])
        return self.client._tensor_call(
            "Evaluate", request, {"inputs": arrays}, expected,
            lambda response, read: {**_decode(response.outputs, read), **_decode(response.nodes, read)})

    def gradient(self, inputs: Mapping[str, object], wrt: str | Iterable[str] | None = None,
                 seeds: Mapping[str, object] | None = None,
                 outputs: str | Iterable[str] | None = None, return_outputs: bool = False, *,
                 semiring: str = "real", semiring_params: Mapping[str, object] | None = None,
                 return_components: bool = False,
                 best_path: Iterable[tuple[str, Iterable[int]]] | None = None, backend: str = "auto",
                 retain: str | Iterable[str] | None = None, hooks: Mapping[str, object] | None = None):
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

        ``retain`` names intermediate nodes whose gradients come back in ``gradients.retained``.
        ``hooks`` maps node ids to hooks (see :mod:`semigrad.hooks`): callables and
        :class:`PreHook` run here, in this process, while the server waits;
        :class:`ServerHook` runs on the server; what "record" hooks saw is in
        ``gradients.records``.
        """
        wire, local = attachments(hooks)
        request, tensors = self._gradient_request(inputs, wrt, seeds, outputs, return_outputs, semiring,
                                                  semiring_params, return_components, best_path, backend, retain,
                                                  wire)
        if local:
            _fill(request, tensors, None)
            gradients = self._gradient_with_client_hooks(request, local)
        else:
            gradients = self.client._tensor_call("Gradient", request, tensors,
                                                 lambda: self._gradient_result_bytes(request, tensors["inputs"]),
                                                 _gradients_from)
        return (gradients, gradients.outputs) if return_outputs else gradients

    def _gradient_with_client_hooks(self, request: pb.GradientRequest, local: dict) -> Gradients:
        """GradientWithHooks: answer each HookCall by running the client's function."""
        outgoing: queue.Queue = queue.Queue()
        outgoing.put(pb.HookStreamRequest(start=request))
        failure: list[BaseException] = []

        def requests():
            while (item := outgoing.get()) is not None:
                yield item

        try:
            for message in self.client._stub.GradientWithHooks(requests(), timeout=self.client.timeout):
                if message.WhichOneof("kind") == "result":
                    return _gradients_from(message.result)
                call = message.call
                reply = pb.HookReply(call=call.call)
                try:
                    fn = local[call.node, call.kind]
                    if call.kind == "post":
                        value = fn(codec.from_tensor(call.contributions[0].value))
                    else:
                        value = fn([Contribution(c.consumer, c.operand, codec.from_tensor(c.value))
                                    for c in call.contributions])
                    reply.value.CopyFrom(codec.to_tensor(np.asarray(value, dtype=np.float64)))
                except Exception as e:  # the user's hook failed: tell the server, then re-raise it here
                    failure.append(e)
                    reply.error = f"{type(e).__name__}: {e}"
                outgoing.put(pb.HookStreamRequest(reply=reply))
        except grpc.RpcError as error:
            if failure:
                raise failure[0] from from_rpc_error(error)
            raise from_rpc_error(error) from error
        finally:
            outgoing.put(None)
        raise SemigradError("the server closed GradientWithHooks without a result")

    def gradient_many(self, inputs: Mapping[str, object], chunk_size: int | None = None, *,
                      progress: bool | None = None, **options) -> Gradients:
        """:meth:`gradient` for a large batch, streamed in chunks of ``chunk_size`` items along the
        first batch axis (one GradientStream call): the server works on one chunk while the next
        is on the wire, and no message grows with the batch. ``chunk_size=None`` (default) makes
        chunks of nearly equal size holding at most about 64 MiB of tensors (inputs and results)
        through shared memory, 2 MiB inline; a batch that fits in one chunk is one Gradient call,
        which costs less than a stream. Takes the options of :meth:`gradient` (except
        ``best_path`` and ``hooks``) and returns the reassembled :class:`Gradients`.
        ``progress``: show a tqdm progress bar (default: when tqdm is installed and there are
        more than 8 chunks). A failing chunk does not stop the others; afterwards the first
        failure is raised, naming every failed chunk.
        """
        for option in ("best_path", "hooks"):
            if options.get(option):
                raise TypeError(f"gradient_many does not take {option}=: use gradient")
        if chunk_size is not None and chunk_size < 1:
            raise ValueError("chunk_size must be at least 1")
        arrays = _arrays(inputs, self.input_specs)
        batched = {name for name, a in arrays.items()
                   if name in self.input_specs and a.ndim > len(self.input_specs[name].shape)}
        sizes = {arrays[name].shape[0] for name in batched}
        if len(sizes) > 1:
            raise ValueError(f"batched inputs disagree on the first batch axis: {sorted(sizes)}")
        total = sizes.pop() if sizes else 1
        seeds = options.pop("seeds", None) or {}
        seed_arrays = {name: np.asarray(v) for name, v in seeds.items()}

        def cut(values: Mapping[str, np.ndarray], specs, start: int, items: int):
            return {name: a[start:start + items] if _has_batch(a, specs.get(name)) and batched else a
                    for name, a in values.items()}

        if chunk_size is None:
            chunk_size = self._default_chunk_size({name: arrays[name][:1] for name in batched},
                                                  cut(seed_arrays, self.output_specs, 0, 1), total, options)
        starts = list(range(0, total, chunk_size))
        if len(starts) <= 1:  # also an empty batch
            gradients = self.gradient(arrays, seeds=seeds or None, **options)
            return gradients[0] if options.get("return_outputs") else gradients

        client = self.client
        shared = client.shared_memory_off is None
        placements: dict[int, Placement] = {}  # chunk -> its region, until its response is read
        in_flight = threading.BoundedSemaphore(STREAM_REGIONS)
        done = threading.Event()

        def requests():
            for k, start in enumerate(starts):
                request, tensors = self._gradient_request(
                    cut(arrays, self.input_specs, start, chunk_size),
                    seeds=cut(seed_arrays, self.output_specs, start, chunk_size), **options)
                placement = None
                if shared:
                    while not in_flight.acquire(timeout=0.1):  # regions come back as responses are read
                        if done.is_set():
                            return
                    placement = client._placement(
                        tensors, lambda: self._gradient_result_bytes(request, tensors["inputs"]))
                    if placement is None:
                        in_flight.release()
                    elif done.is_set():
                        placement.finish(client._release)
                        return
                    else:
                        placements[k] = placement
                _fill(request, tensors, placement)
                yield pb.GradientStreamRequest(chunk=k, request=request)

        # Through shared memory, the whole batch's results go into a pooled region too, lent like
        # gradient's: no fresh memory to fault in on every call.
        results = client._placement({}, lambda: self._gradient_result_bytes(
            self._gradient_request(arrays, **options)[0], arrays)) if shared else None
        assembly = _Assembly(total, results.allocate if results is not None else None)
        failures = []
        try:
            responses = client._stream("GradientStream", requests())
            if progress or (progress is None and len(starts) > 8):
                responses = _progress(responses, len(starts))
            for message in responses:
                placement = placements.pop(message.chunk, None)
                try:
                    if message.code:
                        failures.append((message.chunk, message.code, message.message))
                    else:  # copied straight from the message or the region into the whole batch's arrays
                        assembly.add(starts[message.chunk], _gradients_from(
                            message.response, placement.view if placement is not None else codec.from_tensor))
                finally:
                    if placement is not None:
                        placement.finish(client._release)
                        in_flight.release()
        finally:
            done.set()
            for placement in list(placements.values()):
                placement.finish(client._release)
            if results is not None:
                results.finish(client._release)  # back to the pool now, or once the lent results are gone
        if shared and any(client._refused(error_for_code(code, text)) for _, code, text in failures):
            return self.gradient_many(inputs, chunk_size, progress=progress, seeds=seeds, **options)
        if failures:
            chunk, code, text = failures[0]
            listed = ", ".join(str(c) for c, _, _ in failures)
            raise error_for_code(code, f"chunk {chunk} (items {starts[chunk]}..): {text} "
                                       f"[failed chunks: {listed} of {len(starts)}]")
        return assembly.result()

    def _default_chunk_size(self, item: Mapping[str, np.ndarray], item_seeds: Mapping[str, np.ndarray],
                            total: int, options: Mapping[str, object]) -> int:
        """gradient_many's default chunk_size for `total` items: chunks of nearly equal size, each
        about STREAM_CHUNK_BYTES_* of tensors at most (`item`, `item_seeds`: the batched inputs and
        seeds cut to their first item)."""
        request, tensors = self._gradient_request(item, seeds=item_seeds, **options)
        per_item = (sum(a.nbytes for a in item.values()) + sum(a.nbytes for a in item_seeds.values())
                    + self._gradient_result_bytes(request, tensors["inputs"]))
        target = STREAM_CHUNK_BYTES_SHARED if self.client.shared_memory_off is None else STREAM_CHUNK_BYTES_INLINE
        most = max(1, target // max(per_item, 1))
        return -(-total // -(-total // most)) if total else most

    def _gradient_request(self, inputs, wrt=None, seeds=None, outputs=None, return_outputs=False,
                          semiring="real", semiring_params=None, return_components=False, best_path=None,
                          backend="auto", retain=None, hooks=()) -> tuple[pb.GradientRequest, dict]:
        """The request without its tensors, and the tensors by request field (see :func:`_fill`)."""
        fields = {"wrt": _names(wrt), "outputs": _names(outputs), "return_outputs": return_outputs,
                  "semiring": semiring if semiring != "real" else "",
                  "semiring_params": {k: codec.attr_value(v) for k, v in (semiring_params or {}).items()},
                  "return_components": return_components,
                  "best_paths": [pb.ElementRef(input=name, index=[int(i) for i in index])
                                 for name, index in best_path or ()],
                  "backend": backend if backend != "auto" else "", "retain": _names(retain), "hooks": list(hooks)}
        # Only what differs from the defaults: a small request's time is mostly such steps.
        request = pb.GradientRequest(graph_id=self.id, **{k: v for k, v in fields.items() if v})
        tensors = {"inputs": _arrays(inputs, self.input_specs)}
        if seeds:
            tensors["seeds"] = _arrays(seeds, self.output_specs, "seed for output")
        return request, tensors

    def _result_bytes(self, arrays: Mapping[str, np.ndarray], specs: Iterable[TensorSpec | None]) -> int:
        """What the response's tensors of these specs (per item) should take with the inputs' batch
        shape, alignment included: the size of the output region offered. An estimate (0 when the
        batch shapes do not broadcast; the server sends what does not fit inline)."""
        leads = [a.shape[:a.ndim - len(self.input_specs[name].shape)] for name, a in arrays.items()
                 if name in self.input_specs]
        if any(leads):
            try:
                items = math.prod(np.broadcast_shapes(*leads))
            except ValueError:
                return 0
        else:
            items = 1  # a single point
        return sum(64 + items * math.prod(spec.shape) * 8 for spec in specs if spec is not None)

    def _gradient_result_bytes(self, request: pb.GradientRequest, arrays: Mapping[str, np.ndarray]) -> int:
        wrt = list(request.wrt) or [name for name, spec in self.input_specs.items()
                                    if spec.dtype in ("float64", "float32")]
        specs = [self.input_specs.get(name) for name in wrt]
        if request.return_outputs:
            specs += [self.output_specs.get(name) for name in (request.outputs or self.output_specs)]
        specs += [self.types.get(node) for node in request.retain]
        return self._result_bytes(arrays, specs)


def _releaser(client_ref: weakref.ref) -> Callable:
    def release(region) -> None:
        client = client_ref()
        if client is None:  # the client is gone, and its pool with it
            region.close()
        else:
            client._give_back(region)

    return release


def _gradients_from(response: pb.GradientResponse, read: Callable = codec.from_tensor) -> Gradients:
    gradients = Gradients(_decode(response.gradients, read))
    gradients.outputs = _decode(response.outputs, read) if response.outputs else {}
    gradients.components = ({x: _decode(parts.tensors, read) for x, parts in response.components.items()}
                            if response.components else {})
    gradients.best_paths = [BestPath.from_proto(p) for p in response.best_paths] if response.best_paths else []
    gradients.retained = _decode(response.retained, read) if response.retained else {}
    gradients.records = ({key: _decode(parts.tensors, read) for key, parts in response.records.items()}
                         if response.records else {})
    return gradients


def _has_batch(value: np.ndarray, spec: TensorSpec | None) -> bool:
    return spec is not None and value.ndim > len(spec.shape)


class _Assembly:
    """A streamed job's results: each chunk's arrays (views of its message or region) copied once
    into arrays for the whole batch, allocated when the first chunk arrives."""

    def __init__(self, total: int, allocate: Callable | None = None):
        self.total = total
        self.allocate = allocate  # (shape, dtype) -> array or None, e.g. in a shared-memory region
        self.arrays: dict[tuple[str, ...], np.ndarray] = {}

    def add(self, start: int, part: Gradients) -> None:
        for key, value in _flat(part).items():
            whole = self.arrays.get(key)
            if whole is None:
                shape = (self.total, *value.shape[1:])
                whole = self.allocate(shape, value.dtype) if self.allocate is not None else None
                if whole is None:
                    whole = np.empty(shape, dtype=value.dtype)
                self.arrays[key] = whole
            if value.shape[1:] != whole.shape[1:] or start + len(value) > self.total:
                raise SemigradError(f"chunk at item {start}: {'/'.join(key)} has shape {value.shape}, "
                                    f"which does not fit the batch's {whole.shape}")
            whole[start:start + len(value)] = value

    def result(self) -> Gradients:
        fields: dict[str, dict] = {"gradients": {}, "outputs": {}, "retained": {}, "components": {}}
        for key, array in self.arrays.items():
            if key[0] == "components":
                fields["components"].setdefault(key[1], {})[key[2]] = array
            else:
                fields[key[0]][key[1]] = array
        result = Gradients(fields["gradients"])
        result.outputs, result.retained, result.components = fields["outputs"], fields["retained"], fields["components"]
        result.best_paths, result.records = [], {}
        return result


def _flat(gradients: Gradients) -> dict[tuple[str, ...], np.ndarray]:
    """Every batched array of a Gradients, keyed by (field, name) or ("components", input, name)."""
    flat = {("gradients", name): a for name, a in gradients.items()}
    flat.update({("outputs", name): a for name, a in gradients.outputs.items()})
    flat.update({("retained", name): a for name, a in gradients.retained.items()})
    flat.update({("components", x, name): a for x, parts in gradients.components.items() for name, a in parts.items()})
    return flat


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
    retained: dict[str, np.ndarray]
    records: dict[str, dict[str, np.ndarray]]



def _path_elements(path) -> list[pb.NodeElement]:
    """A BestPath, or (node, index) pairs or PathSteps, as NodeElements."""
    steps = path.steps if isinstance(path, BestPath) else path or ()
    pairs = [(step.node, step.index) if isinstance(step, PathStep) else step for step in steps]
    return [pb.NodeElement(node=node, index=[int(i) for i in index]) for node, index in pairs]


def _names(names: str | Iterable[str] | None) -> list[str]:
    if names is None:
        return []
    return [names] if isinstance(names, str) else list(names)


def _encode(values: Mapping[str, object], specs: Mapping[str, TensorSpec],
            what: str = "input") -> dict[str, pb.Tensor]:
    """Encode ``values`` by name in their spec's dtype (unknown names: for the server to reject)."""
    return {name: codec.to_tensor(array) for name, array in _arrays(values, specs, what).items()}


def _arrays(values: Mapping[str, object], specs: Mapping[str, TensorSpec],
            what: str = "input") -> dict[str, np.ndarray]:
    """``values`` as arrays in their spec's dtype (unknown names: for the server to reject). A cast
    that would change a value (2.7 into int64, strings...) raises InvalidArgument naming the
    ``what`` by name, both dtypes and the first element at fault (see :func:`codec.cast`)."""
    arrays = {}
    for name, value in values.items():
        if name not in specs:
            arrays[name] = np.asarray(value)
            continue
        dtype = _dtype(specs[name].dtype)
        if type(value) is np.ndarray and value.dtype == dtype:
            arrays[name] = value
            continue
        try:
            arrays[name] = codec.cast(value, dtype, f"{what} '{name}'")
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
    return arrays


@functools.lru_cache(maxsize=16)
def _dtype(name: str) -> np.dtype:
    return np.dtype(name)


def _fill(request, tensors: Mapping[str, Mapping[str, np.ndarray]], placement: Placement | None) -> None:
    """Put the arrays into the request's tensor maps ({field: {name: array}}): inline, or written into
    the placement's region (which is then also offered as the output region)."""
    for field_name, arrays in tensors.items():
        target = getattr(request, field_name)
        target.clear()
        for name, array in arrays.items():
            if placement is None or array.size == 0:
                target[name].CopyFrom(codec.to_tensor(array))
            else:
                target[name].CopyFrom(placement.tensor(array))
    if placement is not None:
        request.output_region.CopyFrom(placement.output_region())


def _decode(tensors: Mapping[str, pb.Tensor], read: Callable = codec.from_tensor) -> dict[str, np.ndarray]:
    return {name: read(tensor) for name, tensor in tensors.items()}
