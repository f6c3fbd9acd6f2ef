"""Requests become typed specs once, from the wire (service.convert). Every field of the proto's
request messages is either carried into the spec or named as the servicer's own (transport);
and a Gradient request is plain (the short path) exactly when it sets nothing but the fields
the short path honours. A field added to the proto without being handled fails here, instead of
being dropped silently on the short path."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from semigrad import codec
from semigrad.v1 import semigrad_pb2 as pb
from semigrad_server.service import convert
from semigrad_server.service.shared_memory import SharedMemory

TENSOR = codec.to_tensor(np.arange(3.0))

# A value that differs from the default, per request field (the servicer's transport fields aside).
GRADIENT_EXAMPLES = {
    "graph_id": "some-graph",
    "inputs": {"x": TENSOR},
    "wrt": ["x"],
    "seeds": {"y": TENSOR},
    "outputs": ["y"],
    "return_outputs": True,
    "semiring": "max_product",
    "semiring_params": {"k": pb.AttrValue(i=3)},
    "return_components": True,
    "best_paths": [pb.ElementRef(input="x", index=[1])],
    "backend": "tensor",
    "retain": ["n1"],
    "hooks": [pb.HookAttachment(node="n1", hook="scale", params={"factor": pb.AttrValue(f=2.0)})],
    "semirings": ["real", "entropy"],
    "best_path_all": True,
    "top_paths": 10,
}
# What the short path honours; any other field set sends a request the general way.
PLAIN_FIELDS = {"graph_id", "inputs", "wrt", "outputs", "return_outputs", "backend"}

EVALUATE_EXAMPLES = {
    "graph_id": "some-graph",
    "inputs": {"x": TENSOR},
    "outputs": ["y"],
    "nodes": ["n1"],
    "backend": "scalar",
}


def request_with(message_type, field: str, value):
    request = message_type()
    target = getattr(request, field)
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, str):
                target[key] = item
            else:
                target[key].CopyFrom(item)
    elif isinstance(value, list):
        target.extend(value)
    else:
        setattr(request, field, value)
    return request


def same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype \
            and np.array_equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def differing_fields(a, b) -> list[str]:
    return [f.name for f in dataclasses.fields(a) if not same(getattr(a, f.name), getattr(b, f.name))]


def gradient_spec(request):
    with SharedMemory().session() as shared:
        return convert.gradient_spec(request, shared)


def evaluate_spec(request):
    with SharedMemory().session() as shared:
        return convert.evaluate_spec(request, shared)


@pytest.mark.parametrize("message_type, examples, transport", [
    (pb.GradientRequest, GRADIENT_EXAMPLES, convert.GRADIENT_TRANSPORT_FIELDS),
    (pb.EvaluateRequest, EVALUATE_EXAMPLES, convert.EVALUATE_TRANSPORT_FIELDS),
], ids=["Gradient", "Evaluate"])
def test_every_request_field_is_either_in_the_spec_or_transport(message_type, examples, transport):
    fields = {f.name for f in message_type.DESCRIPTOR.fields}
    unhandled = fields - set(examples) - transport
    assert not unhandled, (f"{message_type.DESCRIPTOR.name} fields {sorted(unhandled)} are neither carried into "
                           f"the spec (add them to service.convert and to the examples here) nor transport-only")
    assert not set(examples) & transport
    assert set(examples) | transport == fields  # no example for a field the proto no longer has


@pytest.mark.parametrize("field", sorted(GRADIENT_EXAMPLES))
def test_each_gradient_field_reaches_the_spec(field):
    plain = gradient_spec(pb.GradientRequest())
    spec = gradient_spec(request_with(pb.GradientRequest, field, GRADIENT_EXAMPLES[field]))
    assert differing_fields(spec, plain), f"GradientRequest.{field} is dropped on the way to the spec"


@pytest.mark.parametrize("field", sorted(EVALUATE_EXAMPLES))
def test_each_evaluate_field_reaches_the_spec(field):
    plain = evaluate_spec(pb.EvaluateRequest())
    spec = evaluate_spec(request_with(pb.EvaluateRequest, field, EVALUATE_EXAMPLES[field]))
    assert differing_fields(spec, plain), f"EvaluateRequest.{field} is dropped on the way to the spec"


def test_a_request_setting_nothing_is_plain():
    assert gradient_spec(pb.GradientRequest()).is_plain


@pytest.mark.parametrize("field", sorted(GRADIENT_EXAMPLES))
def test_a_gradient_is_plain_exactly_when_it_sets_only_what_the_short_path_honours(field):
    spec = gradient_spec(request_with(pb.GradientRequest, field, GRADIENT_EXAMPLES[field]))
    assert spec.is_plain == (field in PLAIN_FIELDS), \
        f"GradientRequest.{field} set: is_plain is {spec.is_plain}"


@pytest.mark.parametrize("field", sorted(GRADIENT_EXAMPLES))
def test_the_servicer_sends_a_request_the_short_way_only_when_its_spec_is_plain(field):
    """The servicer asks the engine's short path without building a spec for requests
    convert.is_plain_gradient recognises: never one whose spec would not be plain."""
    request = request_with(pb.GradientRequest, field, GRADIENT_EXAMPLES[field])
    assert convert.is_plain_gradient(request) == (field in PLAIN_FIELDS), \
        f"GradientRequest.{field} set: is_plain_gradient is {convert.is_plain_gradient(request)}"
    assert convert.PLAIN_GRADIENT_FIELDS == PLAIN_FIELDS | convert.GRADIENT_TRANSPORT_FIELDS


@pytest.mark.parametrize("spelling", ["", "real"])
def test_the_real_semiring_either_way_it_is_spelled_is_plain(spelling):
    assert gradient_spec(pb.GradientRequest(semiring=spelling)).is_plain


def test_the_output_region_is_the_servicers_alone():
    """A transport field changes where the results go, not the question: the spec is the same."""
    request = pb.GradientRequest(graph_id="g", output_region=pb.SharedMemoryRegion(
        region="semigrad-" + "0" * 32, offset=0, capacity=1024))
    assert not differing_fields(gradient_spec(request), gradient_spec(pb.GradientRequest(graph_id="g")))
