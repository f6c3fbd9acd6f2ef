"""Shared memory cannot be turned against anyone (issue 13): a requester that cannot prove access
to a region (its capability, written by the region's client into the region's header) can make
the server neither read it nor write it, whatever it names and wherever; only local peers may
name regions at all. The attacker is simulated (requests that know a victim region's name, as
every user of the host does from /dev/shm, but not its capability), and, when the tests run as
root, is a real second user (`nobody`) probing the files itself and sending its own requests."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import textwrap

import grpc
import numpy as np
import pytest
import semigrad as sg
from semigrad import codec
from semigrad.shared_memory import CAPABILITY_BYTES, HEADER_BYTES, SHM_DIR, Region
from semigrad.v1 import semigrad_pb2 as pb
from semigrad.v1 import semigrad_pb2_grpc as pb_grpc
from semigrad_server.errors import FailedPrecondition
from semigrad_server.limits import Limits
from semigrad_server.service import build_server
from semigrad_server.service.shared_memory import SharedMemory, is_local_peer

pytestmark = pytest.mark.skipif(not os.access(SHM_DIR, os.W_OK), reason="needs a writable /dev/shm")

SECRET = np.array([3.0, -1.5, 2.25, 8.0])  # the victim's data: an attacker that got the server to read
# it would see it in the outputs of the copying graph below


def copy_graph() -> sg.Graph:
    """y = x * 1 and s = sum(x * x): return_outputs gives the input back, its gradient 2x."""
    g = sg.Graph()
    x = g.input("x", (4,))
    g.output("y", x * 1.0)
    g.output("s", sg.sum(x * x))
    return g


@pytest.fixture(scope="module")
def graph_id(client):
    return client.register(copy_graph()).id


@pytest.fixture
def stub(server_address):
    with grpc.insecure_channel(server_address) as channel:
        yield pb_grpc.GraphServiceStub(channel)


@pytest.fixture
def victim():
    """Another client's region: the secret at byte 64, results space after it."""
    region = Region(1 << 16)
    region.array(np.dtype("<f8"), SECRET.shape, HEADER_BYTES)[...] = SECRET
    yield region
    region.close()


def digest(region_name: str) -> str:
    with open(os.path.join(SHM_DIR, region_name), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def ref(name: str, capability: bytes, offset: int = HEADER_BYTES) -> pb.Tensor:
    return pb.Tensor(dtype=pb.DTYPE_FLOAT64, shape=[4], shared=pb.SharedMemoryRef(
        region=name, offset=offset, capability=capability))


def room(name: str, capability: bytes) -> pb.SharedMemoryRegion:
    return pb.SharedMemoryRegion(region=name, offset=4096, capacity=8192, capability=capability)


def attacks(stub, graph_id: str, name: str, capability: bytes):
    """Every place a request can name a region: (label the message must name, call). Inputs
    that are not the region's travel inline."""
    inline = {"x": codec.to_tensor(np.ones(4))}
    seed = {"y": codec.to_tensor(np.ones(4))}
    named = {"x": ref(name, capability)}

    def stream(request):
        responses = list(stub.GradientStream(iter([pb.GradientStreamRequest(chunk=0, request=request)])))
        (response,) = responses
        if response.code:  # a chunk's error travels in the chunk
            raise ChunkError(response.code, response.message)
        return response

    return [
        ("input 'x'", lambda: stub.Gradient(pb.GradientRequest(graph_id=graph_id, inputs=named, return_outputs=True))),
        ("input 'x'", lambda: stub.Evaluate(pb.EvaluateRequest(graph_id=graph_id, inputs=named))),
        ("seed 'y'", lambda: stub.Gradient(pb.GradientRequest(graph_id=graph_id, inputs=inline, outputs=["y"],
                                                               seeds={"y": ref(name, capability)}))),
        ("output_region", lambda: stub.Gradient(pb.GradientRequest(graph_id=graph_id, inputs=inline,
                                                                    return_outputs=True,
                                                                    output_region=room(name, capability)))),
        ("output_region", lambda: stub.Evaluate(pb.EvaluateRequest(graph_id=graph_id, inputs=inline,
                                                                    output_region=room(name, capability)))),
        ("input 'x'", lambda: stream(pb.GradientRequest(graph_id=graph_id, inputs=named, return_outputs=True))),
        ("output_region", lambda: stream(pb.GradientRequest(graph_id=graph_id, inputs=inline,
                                                             output_region=room(name, capability)))),
        ("input 'x'", lambda: stub.Gradient(pb.GradientRequest(graph_id=graph_id, inputs=named, seeds=seed,
                                                                outputs=["y"], output_region=room(name, capability)))),
    ]


class ChunkError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code_number, self.message = code, message


def refusal(call) -> tuple[grpc.StatusCode, str]:
    try:
        call()
    except grpc.RpcError as e:
        return e.code(), e.details()
    except ChunkError as e:
        return next(c for c in grpc.StatusCode if c.value[0] == e.code_number), e.message
    return grpc.StatusCode.OK, ""


def assert_serves(stub, graph_id):
    response = stub.Gradient(pb.GradientRequest(graph_id=graph_id, inputs={"x": codec.to_tensor(SECRET * 0 + 2.0)},
                                                outputs=["s"]))
    np.testing.assert_array_equal(codec.from_tensor(response.gradients["x"]), np.full(4, 4.0))


# ------------------------------------------------------------------------------ the capability


WRONG = {
    "missing": lambda real, other: b"",
    "random": lambda real, other: secrets.token_bytes(CAPABILITY_BYTES),
    "zeros": lambda real, other: bytes(CAPABILITY_BYTES),
    "short prefix": lambda real, other: real[:16],
    "one byte off": lambda real, other: real[:-1] + bytes([real[-1] ^ 1]),
    "too long": lambda real, other: real + b"\0",
    "another region's": lambda real, other: other,
}


@pytest.mark.parametrize("how", list(WRONG))
def test_a_region_named_without_its_capability_is_neither_read_nor_written(stub, graph_id, victim, how):
    other = Region(1 << 12)  # the attacker's own region: a capability that is real, for another region
    try:
        before = digest(victim.name)
        capability = WRONG[how](victim.capability, other.capability)
        for label, call in attacks(stub, graph_id, victim.name, capability):
            code, details = refusal(call)
            assert code == grpc.StatusCode.PERMISSION_DENIED, (label, code, details)
            assert label in details and victim.name in details and "capability" in details, details
            assert str(SECRET[0]) not in details
        assert digest(victim.name) == before  # nothing written, not even the output region's bytes
    finally:
        other.close()
    assert_serves(stub, graph_id)


def test_the_same_requests_with_the_capability_are_served(stub, graph_id, victim):
    """The control: with the right capability every place reads and writes the region."""
    for label, call in attacks(stub, graph_id, victim.name, victim.capability):
        assert refusal(call)[0] == grpc.StatusCode.OK, label
    response = stub.Gradient(pb.GradientRequest(graph_id=graph_id, inputs={"x": ref(victim.name, victim.capability)},
                                                outputs=["s"], return_outputs=True))
    np.testing.assert_array_equal(codec.from_tensor(response.outputs["s"]), SECRET @ SECRET)
    np.testing.assert_array_equal(codec.from_tensor(response.gradients["x"]), 2 * SECRET)
    response = stub.Evaluate(pb.EvaluateRequest(graph_id=graph_id, inputs={"x": ref(victim.name, victim.capability)}))
    np.testing.assert_array_equal(codec.from_tensor(response.outputs["y"]), SECRET)


def test_a_real_clients_regions_are_refused_to_a_requester_that_only_knows_their_names(server_address, stub,
                                                                                       graph_id):
    with sg.Client(server_address, shared_memory=True) as owner:
        f = owner.get_graph(graph_id)
        outputs = f.evaluate({"x": np.tile(SECRET, (1000, 1))})  # lent: the region stays the owner's
        (name,) = owner.shared_memory_regions()
        assert name in os.listdir(SHM_DIR)  # what every local user sees
        before = digest(name)
        for label, call in attacks(stub, graph_id, name, b""):
            code, details = refusal(call)
            assert code == grpc.StatusCode.PERMISSION_DENIED and name in details, (label, code, details)
        assert digest(name) == before
        np.testing.assert_array_equal(outputs["y"][-1], SECRET)
        np.testing.assert_array_equal(f.gradient({"x": np.tile(SECRET, (1000, 1))}, outputs=["s"])["x"][0],
                                      2 * SECRET)


def test_a_region_replaced_after_its_capability_was_written_is_refused(stub, graph_id, victim):
    """The server checks the capability against the file it reads, every request: a file put
    in the region's place (os.replace: same name, new inode), after a request that succeeded
    and left the old one open in the server's cache, does not take the old capability."""
    request = pb.GradientRequest(graph_id=graph_id, inputs={"x": ref(victim.name, victim.capability)},
                                 return_outputs=True)
    assert refusal(lambda: stub.Gradient(request))[0] == grpc.StatusCode.OK
    impostor = Region(1 << 16)
    impostor.array(np.dtype("<f8"), (4,), HEADER_BYTES)[...] = -SECRET
    os.replace(os.path.join(SHM_DIR, impostor.name), os.path.join(SHM_DIR, victim.name))
    code, details = refusal(lambda: stub.Gradient(request))
    assert code == grpc.StatusCode.PERMISSION_DENIED and victim.name in details, details
    # the capability goes with the file's contents: the impostor's own one reads the impostor's data
    response = stub.Gradient(pb.GradientRequest(graph_id=graph_id, inputs={"x": ref(victim.name,
                                                                                    impostor.capability)},
                                                return_outputs=True))
    np.testing.assert_array_equal(codec.from_tensor(response.outputs["y"]), -SECRET)
    impostor.close()
    assert_serves(stub, graph_id)


def test_a_renamed_region_is_not_found_under_its_old_name_and_a_newcomer_there_is_refused(stub, graph_id, victim):
    request = pb.GradientRequest(graph_id=graph_id, inputs={"x": ref(victim.name, victim.capability)},
                                 return_outputs=True)
    assert refusal(lambda: stub.Gradient(request))[0] == grpc.StatusCode.OK
    moved = "semigrad-" + secrets.token_hex(16)
    os.rename(os.path.join(SHM_DIR, victim.name), os.path.join(SHM_DIR, moved))
    try:
        code, details = refusal(lambda: stub.Gradient(request))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "not found" in details, details
        newcomer = Region(1 << 16)  # another file under the old name
        os.rename(os.path.join(SHM_DIR, newcomer.name), os.path.join(SHM_DIR, victim.name))
        code, details = refusal(lambda: stub.Gradient(request))
        assert code == grpc.StatusCode.PERMISSION_DENIED and victim.name in details, details
        newcomer.close()
    finally:
        os.rename(os.path.join(SHM_DIR, moved), os.path.join(SHM_DIR, victim.name))
    assert_serves(stub, graph_id)


def test_a_region_without_a_header_is_refused_even_to_a_zero_capability(stub, graph_id):
    """A file the client never wrote a header into (all zeros) must not accept a capability of zeros."""
    name = "semigrad-" + secrets.token_hex(16)
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, 1 << 16)
        for capability in (bytes(CAPABILITY_BYTES), b""):
            code, details = refusal(lambda: stub.Gradient(pb.GradientRequest(
                graph_id=graph_id, inputs={"x": ref(name, capability)})))
            assert code == grpc.StatusCode.PERMISSION_DENIED and "no capability header" in details, details
        os.ftruncate(fd, 10)  # shorter than a header
        code, details = refusal(lambda: stub.Gradient(pb.GradientRequest(
            graph_id=graph_id, inputs={"x": ref(name, bytes(CAPABILITY_BYTES))})))
        assert code == grpc.StatusCode.PERMISSION_DENIED and "no capability header" in details, details
    finally:
        os.close(fd)
        os.unlink(path)
    assert_serves(stub, graph_id)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o666], ids=lambda m: f"{m:04o}")
def test_a_region_other_users_may_open_proves_nothing(stub, graph_id, victim, mode):
    """Its capability could have been read by anyone it is open to: refused, even with it."""
    os.chmod(os.path.join(SHM_DIR, victim.name), mode)
    code, details = refusal(lambda: stub.Gradient(pb.GradientRequest(
        graph_id=graph_id, inputs={"x": ref(victim.name, victim.capability)})))
    assert code == grpc.StatusCode.PERMISSION_DENIED and f"mode {mode:04o}" in details, details
    os.chmod(os.path.join(SHM_DIR, victim.name), 0o600)
    assert refusal(lambda: stub.Gradient(pb.GradientRequest(
        graph_id=graph_id, inputs={"x": ref(victim.name, victim.capability)})))[0] == grpc.StatusCode.OK


def test_the_capability_is_compared_in_constant_time():
    """hmac.compare_digest, not ==: the server module's comparison (read, not timed: timing
    tests of a few nanoseconds are noise on a shared machine)."""
    import inspect

    from semigrad_server.service import shared_memory as server_shm

    source = inspect.getsource(server_shm.Session._region)
    assert "hmac.compare_digest(capability, expected)" in source
    assert "capability ==" not in source and "== capability" not in source


# ------------------------------------------------------------------------------ local peers only


@pytest.mark.parametrize("peer,local", [
    ("ipv4:127.0.0.1:5000", True), ("ipv4:127.8.9.10:1", True), ("ipv6:%5B::1%5D:60756", True),
    ("ipv6:[::1]:5000", True), ("ipv6:%5B::ffff:127.0.0.1%5D:5000", True), ("unix:", True),
    ("unix:/tmp/s.sock", True), ("unix-abstract:x", True),
    ("ipv4:10.0.0.5:5000", False), ("ipv4:192.168.1.2:5000", False), ("ipv6:%5B2001:db8::1%5D:5000", False),
    ("ipv6:%5B::ffff:10.0.0.1%5D:5000", False), ("ipv4:0.0.0.0:1", False), ("", False), ("dns:localhost:1", False),
    ("ipv4:localhost:1", False), ("ipv6:::1", False), ("vsock:2:5000", False)])
def test_which_peers_are_local(peer, local):
    assert is_local_peer(peer) is local


def test_a_remote_peer_may_not_name_a_region_at_all(victim):
    """Refused before the name is looked at: FAILED_PRECONDITION naming shared memory, so an
    "auto" client behind a proxy falls back inline."""
    shared = SharedMemory()
    tensor = ref(victim.name, victim.capability)
    for peer in ("ipv4:10.1.2.3:4567", "ipv6:%5B2001:db8::1%5D:1", ""):
        with shared.session(peer) as session, pytest.raises(FailedPrecondition, match="shared memory is only for "
                                                                                       "clients on the server's host"):
            session.array(tensor, "input 'x'")
        with shared.session(peer) as session, pytest.raises(FailedPrecondition, match="output_region"):
            session.writer(room(victim.name, victim.capability))
    assert shared.opened() == []  # never opened
    with shared.session("ipv4:127.0.0.1:4567") as session:
        np.testing.assert_array_equal(session.array(tensor, "input 'x'"), SECRET)
    shared.close()


@pytest.mark.parametrize("family", ["ipv6", "unix"])
def test_loopback_ipv6_and_unix_socket_clients_use_shared_memory(graph_id, family, rng):
    """The peers grpc reports for them ('ipv6:%5B::1%5D:port', 'unix:') count as local."""
    directory = tempfile.mkdtemp()
    address = "[::1]:0" if family == "ipv6" else f"unix:{directory}/semigrad.sock"
    try:
        server, port, _ = build_server(address, limits=Limits())
    except OSError:
        shutil.rmtree(directory)
        pytest.skip(f"cannot listen on {address}")
    server.start()
    try:
        target = f"[::1]:{port}" if family == "ipv6" else address
        with sg.Client(target, shared_memory=True) as c:
            f = c.register(copy_graph())
            xs = rng.normal(size=(3000, 4))
            np.testing.assert_array_equal(f.gradient({"x": xs}, outputs=["s"])["x"], 2 * xs)
            assert c.shared_memory_regions()
    finally:
        server.stop(0).wait()
        shutil.rmtree(directory)


# ------------------------------------------------------------------------------ a real second user


ATTACKER = textwrap.dedent("""
    import json, os, secrets, sys
    import grpc, numpy as np
    from semigrad import codec
    from semigrad.shared_memory import Region, SHM_DIR
    from semigrad.v1 import semigrad_pb2 as pb, semigrad_pb2_grpc as pb_grpc

    address, graph_id, target = sys.argv[1:4]
    report = {"uid": os.geteuid(), "seen": [], "opened": [], "linked": [], "results": []}
    own = Region(1 << 16)  # the attacker's own region, header and all: owned by the attacker
    victims = [n for n in os.listdir(SHM_DIR) if n == target]  # (other tests' regions come and go)
    report["seen"] = victims
    for name in victims:
        try:
            with open(os.path.join(SHM_DIR, name), "rb") as f:
                report["opened"].append([name, f.read(64).hex()])
        except OSError:
            pass
    aliases = {}
    for name in victims:
        alias = "semigrad-" + secrets.token_hex(16)
        try:
            os.link(os.path.join(SHM_DIR, name), os.path.join(SHM_DIR, alias))
            report["linked"].append(name)
        except OSError:
            os.symlink(os.path.join(SHM_DIR, name), os.path.join(SHM_DIR, alias))
        aliases[name] = alias
    stub = pb_grpc.GraphServiceStub(grpc.insecure_channel(address))
    inline = {"x": codec.to_tensor(np.ones(4))}
    def ref(name, cap):
        return pb.Tensor(dtype=pb.DTYPE_FLOAT64, shape=[4], shared=pb.SharedMemoryRef(region=name, offset=64,
                                                                                       capability=cap))
    def room(name, cap):
        return pb.SharedMemoryRegion(region=name, offset=4096, capacity=8192, capability=cap)
    for name in victims + [aliases[n] for n in victims] + [own.name]:
        for cap in (b"", own.capability, secrets.token_bytes(32), bytes(32)):
            for place, request in (
                    ("input", pb.GradientRequest(graph_id=graph_id, inputs={"x": ref(name, cap)},
                                                 return_outputs=True)),
                    ("output", pb.GradientRequest(graph_id=graph_id, inputs=inline, return_outputs=True,
                                                  output_region=room(name, cap)))):
                try:
                    response = stub.Gradient(request, timeout=30)
                    code, details = "OK", str(codec.from_tensor(response.outputs["y"])) \\
                        if response.outputs["y"].WhichOneof("payload") == "data" else "shared"
                except grpc.RpcError as e:
                    code, details = e.code().name, e.details()
                report["results"].append([name, place, cap.hex(), code, details])
    for alias in aliases.values():
        os.unlink(os.path.join(SHM_DIR, alias))
    own.close()
    print(json.dumps(report))
""")


def test_a_second_local_user_can_neither_read_nor_write_another_users_region(server_address, graph_id, victim):
    """As root, the attacker runs as `nobody`: it sees the victim's region in /dev/shm, cannot
    open it, cannot hard-link it (protected_hardlinks; a symlink it can make is not followed),
    and every request it makes naming it (or its own region, owned by another user than the
    server's) is refused; the victim's bytes are unchanged."""
    if os.geteuid() != 0:
        pytest.skip("creating a second user's process needs root")
    try:
        import pwd

        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' on this host")
    python = shutil.which("python3", path="/usr/bin:/usr/local/bin")
    paths = {os.path.dirname(os.path.dirname(sg.__file__)), os.path.dirname(os.path.dirname(grpc.__file__)),
             os.path.dirname(os.path.dirname(np.__file__))}
    if python is None:
        pytest.skip("no python3 that another user can run")
    before = digest(victim.name)
    result = subprocess.run([python, "-c", ATTACKER, server_address, graph_id, victim.name], capture_output=True,
                            text=True,
                            timeout=120, user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[],
                            env={"PYTHONPATH": os.pathsep.join(sorted(paths)), "PATH": "/usr/bin:/bin"}, cwd="/")
    if result.returncode != 0 and ("ModuleNotFoundError" in result.stderr or "ImportError" in result.stderr):
        pytest.skip(f"the second user's python cannot import the client: {result.stderr[-300:]}")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["uid"] == nobody.pw_uid
    assert report["seen"] == [victim.name]  # names are public...
    assert report["opened"] == [] and report["linked"] == []  # ...contents are not
    assert len(report["results"]) == 3 * 4 * 2  # victim, its alias, own region × 4 capabilities × 2 places
    for name, place, capability, code, details in report["results"]:
        assert code in ("PERMISSION_DENIED", "FAILED_PRECONDITION"), (name, place, capability, code, details)
        assert str(SECRET[0]) not in details
    assert any(r[0] == victim.name and r[3] == "PERMISSION_DENIED" for r in report["results"])
    assert digest(victim.name) == before
