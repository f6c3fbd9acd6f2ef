"""gradient_many: a large batch cut into chunks along its first batch axis, streamed through one
GradientStream call, or several at once (`streams`: calls a load balancer may spread over
replicas), a few chunks in flight per call, each in a shared-memory region of its own or inline;
the chunks' results reassembled into arrays for the whole batch."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from . import messages
from .errors import InvalidArgument, ResourceExhausted, SemigradError, Unavailable, error_for_code
from .messages import Gradients, SemiringGradients
from .shared_memory import Placement
from .specs import TensorSpec
from .transport import fill
from .v1 import semigrad_pb2 as pb

if TYPE_CHECKING:
    from .client import RegisteredGraph

STREAM_REGIONS = 4  # shared-memory regions one GradientStream keeps in flight (chunks on the wire)
# The default chunk: about this many bytes of tensors (inputs and results). Measured on loopback
# (bench/stream_chunks.py): through shared memory a chunk costs ~1 ms on top of its compute and
# moves nothing, so chunks are large; inline, encoding, the wire and decoding overlap best around
# 1-2 MiB (larger messages slow down).
STREAM_CHUNK_BYTES_SHARED = 64 << 20
STREAM_CHUNK_BYTES_INLINE = 2 << 20
# A stream costs its setup and a message per chunk, and gains only by overlapping chunks: a batch of
# at most this many chunks' bytes goes as one Gradient call (det4 and det5, 10,000 items, 4 MB inline,
# were two chunks, 0.6-0.75x the throughput of one call).
STREAM_MIN_CHUNKS = 4
# A stream that breaks with UNAVAILABLE after some answers is resumed with the unanswered chunks
# this many times, after 0.1, 0.2, 0.4, 0.8 s (as transport.RETRY_POLICY retries calls without answers).
RESUMES = 4
RESUME_BACKOFF = 0.1
RESOURCE_EXHAUSTED = 8  # grpc.StatusCode.RESOURCE_EXHAUSTED's number, as chunk responses carry it


class Batch:
    """gradient_many's inputs and seeds as arrays, and the length of the first batch axis of the
    inputs that have batch axes (1 when none has)."""

    def __init__(self, graph: RegisteredGraph, inputs: Mapping[str, object], seeds: Mapping[str, object]):
        self.graph = graph
        specs = graph.input_specs
        self.inputs = messages.arrays(inputs, specs)
        self.seeds = messages.arrays(seeds, graph.output_specs, "seed for output")
        self.batched = {name for name, a in self.inputs.items() if _has_batch(a, specs.get(name))}
        _broadcast_batch(self.inputs, specs, self.batched, self.seeds, graph.output_specs)
        sizes = {self.inputs[name].shape[0] for name in self.batched}
        self.total = sizes.pop() if sizes else 1
        # items in one index of the first batch axis (what chunks are cut along): the product of
        # the other batch axes, for turning the server's item counts (max_items) into rows
        leads = [self.inputs[name].shape[1:self.inputs[name].ndim - len(specs[name].shape)] for name in self.batched]
        self.row_items = max(1, math.prod(max(leads, key=len))) if leads else 1

    def limit_key(self, options: Mapping[str, object]) -> tuple:
        """What decides the server's plan, and so how many items its limits allow per chunk:
        the request's options and which inputs carry the batch."""
        return repr(sorted(options.items())), tuple(sorted(self.batched)), tuple(sorted(self.seeds))

    def chunk(self, start: int, items: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The inputs and seeds of items start..start + items (values without batch axes whole)."""
        inputs = _cut(self.inputs, self.graph.input_specs, start, items, self.batched)
        return inputs, _cut(self.seeds, self.graph.output_specs, start, items, self.batched)


def _broadcast_batch(inputs: dict[str, np.ndarray], specs: Mapping[str, TensorSpec], batched: set[str],
                     seeds: dict[str, np.ndarray], seed_specs: Mapping[str, TensorSpec]) -> None:
    """Batch shapes that differ but broadcast (NumPy's rules, as gradient takes them: (1,) with
    (6,), (5,) under (2, 5)) become the broadcast shape, as read-only views, so that chunks cut
    along the first batch axis hold the same items as one call; shapes that do not broadcast are
    the server's INVALID_ARGUMENT, worded as it words it."""
    leads = [(name, a.shape[:a.ndim - len(specs[name].shape)] if name in batched else ()) for name, a in inputs.items()]
    if len({lead for _, lead in leads if lead}) <= 1:
        return
    try:
        shape = tuple(np.broadcast_shapes(*(lead for _, lead in leads if lead)))
    except ValueError:
        described = ", ".join(f"{name}: {list(lead)}" for name, lead in leads)
        raise InvalidArgument(f"batch dimensions of the inputs do not broadcast ({described})") from None
    for name in batched:
        inputs[name] = np.broadcast_to(inputs[name], shape + tuple(specs[name].shape))
    for name, seed in seeds.items():
        spec = seed_specs.get(name)
        if spec is not None and seed.ndim > len(spec.shape):
            seeds[name] = np.broadcast_to(seed, shape + tuple(spec.shape))


def _cut(values: Mapping[str, np.ndarray], specs: Mapping[str, TensorSpec], start: int, items: int,
         batched: set[str]) -> dict[str, np.ndarray]:
    return {name: a[start:start + items] if batched and _has_batch(a, specs.get(name)) else a
            for name, a in values.items()}


def _has_batch(value: np.ndarray, spec: TensorSpec | None) -> bool:
    return spec is not None and value.ndim > len(spec.shape)


def default_chunk_size(batch: Batch, options: Mapping[str, object], target_bytes: int | None = None) -> int:
    """gradient_many's default chunk_size: chunks of nearly equal size, each about `target_bytes`
    of tensors at most (default: STREAM_CHUNK_BYTES_SHARED through shared memory, else
    STREAM_CHUNK_BYTES_INLINE; with those, the whole batch when it is at most STREAM_MIN_CHUNKS
    such chunks); never more items than the server's limits allowed a chunk of this request's shape
    (learned from its refusals). `options`: those of the gradient call."""
    graph = batch.graph
    item = {name: batch.inputs[name][:1] for name in batch.batched}
    _, item_seeds = batch.chunk(0, 1)
    request, tensors = messages.gradient_request(graph, item, seeds=item_seeds, **options)
    per_item = (sum(a.nbytes for a in item.values()) + sum(a.nbytes for a in item_seeds.values())
                + messages.gradient_result_bytes(graph, request, tensors["inputs"]))
    default_target = target_bytes is None
    if default_target:
        shared = graph.client.transport.shared_memory_off is None
        target_bytes = STREAM_CHUNK_BYTES_SHARED if shared else STREAM_CHUNK_BYTES_INLINE
    total = batch.total
    most = max(1, target_bytes // max(per_item, 1))
    if default_target and total <= STREAM_MIN_CHUNKS * most:  # too few chunks to gain from a stream: one call
        most = max(total, 1)
    allowed = graph.chunk_limits.get(batch.limit_key(options))  # the server's limits, once learned
    if allowed:
        most = min(most, allowed)
    return -(-total // -(-total // most)) if total else most


def gradient_many(graph: RegisteredGraph, inputs: Mapping[str, object], chunk_size: int | None,
                  progress: bool | None, options: dict, streams: int = 1) -> Gradients:
    """RegisteredGraph.gradient_many (which documents it)."""
    for option in ("best_path", "hooks", "top_paths"):
        if options.get(option):
            raise TypeError(f"gradient_many does not take {option}=: use gradient")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError("chunk_size must be at least 1")
    if streams < 1:
        raise ValueError("streams must be at least 1")
    seeds = options.pop("seeds", None) or {}
    batch = Batch(graph, inputs, seeds)
    chosen = chunk_size is None
    if chosen:
        chunk_size = default_chunk_size(batch, options)
        if streams > 1 and batch.total:  # at least one chunk per stream
            chunk_size = min(chunk_size, -(-batch.total // streams))
    starts = list(range(0, batch.total, chunk_size))
    if len(starts) <= 1:  # also an empty batch
        try:
            gradients = graph.gradient(batch.inputs, seeds=seeds or None, **options)
        except ResourceExhausted:
            # Over the server's limits for one request? Its refusals of chunks say how many items
            # fit (GradientStreamResponse.max_items): stream halves, which are cut to that.
            if not chosen or batch.total < 2:
                raise
            chunk_size = -(-batch.total // 2)
            starts = [0, chunk_size]
        else:
            return gradients[0] if options.get("return_outputs") else gradients

    transport = graph.client.transport
    shared = transport.shared_memory_off is None
    # Through shared memory, the whole batch's results go into a pooled region too, lent like
    # gradient's: no fresh memory to fault in on every call.
    results = transport.placement({}, lambda: messages.gradient_result_bytes(
        graph, messages.gradient_request(graph, batch.inputs, **options)[0], batch.inputs)) if shared else None
    assembly = Assembly(batch.total, results.allocate if results is not None else None)
    failures: list[tuple[int, int, str]] = []
    # Chunks the server refused for their number of items: {chunk: the items it allows}. The
    # first refusal stops the sending; refused and unsent chunks go again, cut to the allowance.
    refused: dict[int, int] = {}
    streams = min(streams, len(starts))
    # Stream s carries chunks s, s + streams, ...: each stream is a call of its own, which a load
    # balancer (or the client's round-robin over replicas) may send to another replica.
    groups = [list(range(s, len(starts), streams)) for s in range(streams)]
    show = progress or (progress is None and len(starts) > 8)

    def run_resuming(group: list[int], show_progress: bool) -> None:
        pending = group  # chunks without an answer yet
        for resumed in range(RESUMES + 1):
            answered: set[int] = set()
            try:
                _stream(graph, batch, starts, pending, chunk_size, options, shared, assembly, failures,
                        show_progress, answered, refused)
                return
            except Unavailable:
                # The stream broke after some answers (a worker died, say): gRPC's retry policy does
                # not replay a call that has had responses, so the chunks still unanswered go again
                # in a new stream. Chunks are pure functions of their inputs: sending one twice is safe.
                if not answered or resumed == RESUMES or not transport.retries:
                    raise
                pending = [k for k in pending if k not in answered]
                time.sleep(RESUME_BACKOFF * 2 ** resumed)

    try:
        if streams == 1:
            run_resuming(groups[0], show)
        else:
            errors: list[BaseException] = []

            def run(group):
                try:
                    run_resuming(group, False)
                except BaseException as e:  # noqa: BLE001 - raised in the caller's thread below
                    errors.append(e)

            threads = [threading.Thread(target=run, args=(group,), name="semigrad-stream", daemon=True)
                       for group in groups]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if errors:
                # Streams the server refused at once while others were admitted (the tenant's
                # max_tenant_requests, a worker's max_streams: RESOURCE_EXHAUSTED at the start of
                # the call) leave their chunks to one more stream, once the admitted ones are done.
                if len(errors) == len(groups) or not all(isinstance(e, ResourceExhausted) for e in errors):
                    raise errors[0]
                if not refused:  # (refused chunks, and those left with them, go again below)
                    done = assembly.chunks | {chunk for chunk, _, _ in failures}
                    run_resuming([k for k in range(len(starts)) if k not in done], False)
        if refused:  # (before the results' region goes back to the pool: the assembly may not hold it yet)
            allowed = min(refused.values())
            graph.chunk_limits[batch.limit_key(options)] = allowed
            failed = {chunk for chunk, _, _ in failures}
            for k in range(len(starts)):
                if k in failed or k in assembly.chunks:
                    continue
                items = min(chunk_size, batch.total - starts[k])
                part_inputs, part_seeds = batch.chunk(starts[k], items)
                assembly.add(starts[k], gradient_many(graph, part_inputs, min(allowed, items), False,
                                                      {**options, "seeds": part_seeds}, streams), k)
    finally:
        if results is not None:
            results.finish(transport.release)  # back to the pool now, or once the lent results are gone
    if shared and any(transport.shared_memory_refused(error_for_code(code, text)) for _, code, text in failures):
        return gradient_many(graph, inputs, chunk_size, progress, {**options, "seeds": seeds}, streams)
    if failures:
        failures.sort()
        chunk, code, text = failures[0]
        listed = ", ".join(str(c) for c, _, _ in failures)
        raise error_for_code(code, f"chunk {chunk} (items {starts[chunk]}..): {text} "
                                   f"[failed chunks: {listed} of {len(starts)}]")
    result = assembly.result()
    semiring = options.get("semiring")
    if isinstance(result, SemiringGradients) and semiring is not None and not isinstance(semiring, str):
        result = result.ordered(list(semiring))  # the wire's map of semirings has no order
    return result


def _stream(graph: RegisteredGraph, batch: Batch, starts: list[int], chunks: list[int], chunk_size: int,
            options: dict, shared: bool, assembly: Assembly, failures: list, show_progress: bool,
            answered: set[int], refused: dict[int, int]) -> None:
    """One GradientStream call carrying `chunks` (indices into `starts`); their results go into
    `assembly`, their failures (chunk, code, message) into `failures`, and their chunk numbers into
    `answered`; chunks refused for their size go into `refused` (and no more are sent)."""
    transport = graph.client.transport
    placements: dict[int, Placement] = {}  # chunk -> its region, until its response is read
    in_flight = threading.BoundedSemaphore(STREAM_REGIONS)
    done = threading.Event()

    def requests():
        for k in chunks:
            if refused:  # the rest would be refused too: they go again, smaller
                return
            chunk_inputs, chunk_seeds = batch.chunk(starts[k], chunk_size)
            request, tensors = messages.gradient_request(graph, chunk_inputs, seeds=chunk_seeds, **options)
            placement = None
            if shared:
                while not in_flight.acquire(timeout=0.1):  # regions come back as responses are read
                    if done.is_set():
                        return
                placement = transport.placement(
                    tensors, lambda: messages.gradient_result_bytes(graph, request, tensors["inputs"]))
                if placement is None:
                    in_flight.release()
                elif done.is_set():
                    placement.finish(transport.release)
                    return
                else:
                    placements[k] = placement
            if placement is None:
                yield transport.outgoing(pb.GradientStreamRequest(chunk=k, request=request), tensors, ("request",))
            else:
                fill(request, tensors, placement)
                yield pb.GradientStreamRequest(chunk=k, request=request)

    try:
        responses = transport.tensor_stream("GradientStream", requests())
        if show_progress:
            responses = _progress(responses, len(chunks))
        for message, read in responses:
            placement = placements.pop(message.chunk, None)
            try:
                rows = message.max_items // batch.row_items  # the server counts items over every batch axis
                if message.code == RESOURCE_EXHAUSTED and 0 < rows < chunk_size:
                    refused[message.chunk] = rows
                elif message.code:
                    failures.append((message.chunk, message.code, message.message))
                else:  # copied straight from the message or the region into the whole batch's arrays
                    assembly.add(starts[message.chunk], messages.gradients_from(
                        message.response, placement.view if placement is not None else read),
                        message.chunk)
                answered.add(message.chunk)
            finally:
                if placement is not None:
                    placement.finish(transport.release)
                    in_flight.release()
    finally:
        done.set()
        for placement in list(placements.values()):
            placement.finish(transport.release)


class Assembly:
    """A streamed job's results: each chunk's arrays (views of its message or region) copied once
    into arrays for the whole batch, allocated when the first chunk arrives."""

    def __init__(self, total: int, allocate: Callable | None = None):
        self.total = total
        self.allocate = allocate  # (shape, dtype) -> array or None, e.g. in a shared-memory region
        self.arrays: dict[tuple[str, ...], np.ndarray] = {}
        self.chunks: set[int] = set()  # the chunks added
        self._lock = threading.Lock()  # streams in threads of their own add chunks at once

    def add(self, start: int, part: Gradients, chunk: int = -1) -> None:
        self.chunks.add(chunk)
        for key, value in _flat(part).items():
            with self._lock:
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

    def result(self) -> Gradients | SemiringGradients:
        by_semiring: dict[str, dict] = {}
        rest = {}
        for key, array in self.arrays.items():
            if key[0] == "semiring":
                by_semiring.setdefault(key[1], {})[key[2:]] = array
            else:
                rest[key] = array
        if not by_semiring:
            return _gradients(rest)
        result = SemiringGradients({name: _gradients(arrays) for name, arrays in by_semiring.items()})
        result.outputs = _gradients(rest).outputs
        return result


def _gradients(arrays: Mapping[tuple[str, ...], np.ndarray]) -> Gradients:
    fields: dict[str, dict] = {"gradients": {}, "outputs": {}, "retained": {}, "components": {}}
    for key, array in arrays.items():
        if key[0] == "components":
            fields["components"].setdefault(key[1], {})[key[2]] = array
        else:
            fields[key[0]][key[1]] = array
    result = Gradients(fields["gradients"])
    result.outputs, result.retained, result.components = fields["outputs"], fields["retained"], fields["components"]
    result.best_paths, result.records = [], {}
    return result


def _flat(gradients: Gradients | SemiringGradients) -> dict[tuple[str, ...], np.ndarray]:
    """Every batched array of a Gradients, keyed by (field, name) or ("components", input, name);
    with several semirings, each one's keyed ("semiring", its name, ...)."""
    if isinstance(gradients, SemiringGradients):
        flat = {("outputs", name): a for name, a in gradients.outputs.items()}
        for semiring, part in gradients.items():
            flat.update({("semiring", semiring) + key: a for key, a in _flat(part).items() if key[0] != "outputs"})
        return flat
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
