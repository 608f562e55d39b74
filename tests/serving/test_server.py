"""The server against the real ``openpi-client``: metadata, actions, seeds, timings, batching, and errors that
stay with the client that caused them."""

import re
import socket
import threading
import urllib.request

import msgpack
import numpy as np
import pytest
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import ConnectionClosedError, InvalidStatus
from websockets.sync.client import connect

from longboat.serving.random_policy import RandomPolicy, RandomPolicyConfig
from longboat.serving.server import PolicyServer, ServerConfig, serving_in_thread
from tests.serving.conftest import SMALL, random_server, small_obs


def test_openpi_client_gets_actions(served):
    server, port = served
    client = WebsocketClientPolicy("127.0.0.1", port)
    meta = client.get_server_metadata()
    assert meta["policy"] == "random" and meta["horizon"] == 10 and meta["observation_shapes"] == SMALL
    first = client.infer({**small_obs(), "seed": 7})
    assert first["actions"].shape == (10, 7) and first["actions"].dtype == np.float32
    assert first["seed"] == 7
    assert first["policy_timing"]["infer_ms"] > 0 and "prev_total_ms" not in first["server_timing"]
    second = client.infer({**small_obs(), "seed": 7})
    np.testing.assert_array_equal(first["actions"], second["actions"])
    assert second["server_timing"]["prev_total_ms"] > 0
    drawn = client.infer(small_obs())  # no seed: the server draws one and says which
    replay = client.infer({**small_obs(), "seed": drawn["seed"]})
    np.testing.assert_array_equal(drawn["actions"], replay["actions"])
    assert not np.allclose(drawn["actions"], first["actions"])


def test_healthz_answers_without_the_api_key():
    with random_server(api_key="sesame") as (_, port):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            assert r.status == 200 and r.read() == b"OK\n"


def _concurrent(port: int, n: int) -> list[np.ndarray]:
    clients = [WebsocketClientPolicy("127.0.0.1", port) for _ in range(n)]
    barrier, out = threading.Barrier(n), [None] * n

    def ask(i):
        barrier.wait()
        out[i] = clients[i].infer({**small_obs(i), "seed": 1000 + i})["actions"]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_concurrent_clients_are_batched_with_the_unbatched_actions():
    with random_server(batch_window_ms=250, policy={"delay_ms": 20}) as (server, port):
        batched = _concurrent(port, 16)
        passes = server.stats.forward_passes
    with random_server(batch_window_ms=0) as (alone, port):
        unbatched = _concurrent(port, 16)
        assert max(alone.stats.batch_sizes) == 1
    assert server.stats.requests == 16 and passes < 16, server.stats.batch_sizes
    for a, b in zip(batched, unbatched):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def test_a_deterministic_server_computes_each_request_alone_whatever_arrives_with_it():
    with random_server(batch_window_ms=250, deterministic=True, policy={"delay_ms": 5}) as (server, port):
        together = _concurrent(port, 8)
        assert set(server.stats.batch_sizes) == {1} and server.stats.requests == 8
    with random_server(deterministic=True) as (_, port):
        client = WebsocketClientPolicy("127.0.0.1", port)
        for i, actions in enumerate(together):
            np.testing.assert_array_equal(actions, client.infer({**small_obs(i), "seed": 1000 + i})["actions"])


def _refused(port: int, payload, **connect_kwargs) -> str:
    """Send one frame the way a broken client would; return what the server answered."""
    with connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None, proxy=None, **connect_kwargs) as ws:
        ws.recv()  # metadata
        ws.send(payload)
        try:
            reply = ws.recv(timeout=10)
        except ConnectionClosedError as e:
            return f"closed {e.rcvd.code}: {e.rcvd.reason}"
        assert isinstance(reply, str)
        with pytest.raises(ConnectionClosedError) as closed:
            ws.recv(timeout=10)
        assert closed.value.rcvd.code == 1011
        return reply


def test_bad_requests_get_errors_while_others_are_served():
    with random_server(max_message_bytes=64 << 10, api_key="sesame") as (server, port):
        good = WebsocketClientPolicy("127.0.0.1", port, api_key="sesame")
        expected = good.infer({**small_obs(), "seed": 1})["actions"]
        auth = {"additional_headers": {"Authorization": "Api-Key sesame"}}
        bad_image = {**small_obs(), "observation/image": np.zeros((16, 16, 3), np.uint8)}
        cases = {
            "not a msgpack message": b"\xc1\x00\x00",
            "observation keys do not match": msgpack_numpy.packb({"observation/img": np.zeros(3)}),
            "expected shape [32, 32, 3]": msgpack_numpy.packb(bad_image),
            "refused dtype": msgpack.packb({"observation/image": {b"__ndarray__": True, b"data": b"\0" * 8,
                                                                  b"dtype": "|O", b"shape": [1]}}),
            "'seed': expected an integer": msgpack_numpy.packb({**small_obs(), "seed": -1}),
            "got a text frame": "hello",
            "closed 1009": b"\0" * (128 << 10),
        }
        for match, payload in cases.items():
            assert match in _refused(port, payload, **auth)
            np.testing.assert_array_equal(good.infer({**small_obs(), "seed": 1})["actions"], expected)
        with pytest.raises(InvalidStatus, match="401"):
            WebsocketClientPolicy("127.0.0.1", port)
        with pytest.raises(InvalidStatus, match="401"):
            WebsocketClientPolicy("127.0.0.1", port, api_key="wrong")
        np.testing.assert_array_equal(good.infer({**small_obs(), "seed": 1})["actions"], expected)
        with pytest.raises(RuntimeError, match="Error in inference server"):  # openpi-client's own error path
            good.infer({"wrong": np.zeros(2)})
        # every bad frame but the oversize one (refused unread by the websocket layer), and the last request
        assert server.stats.errors == len(cases)


class _BrokenPolicy(RandomPolicy):
    """A policy whose forward pass fails on a state that starts with 99, as a bug in a real policy would."""

    def infer(self, observations, seeds):
        if any(o["observation/state"][0] == 99 for o in observations):
            raise RuntimeError("shape mismatch in /srv/secret/model.py line 12")
        return super().infer(observations, seeds)


def test_a_policy_failure_tells_the_client_an_error_id_and_logs_the_traceback(caplog):
    policy = _BrokenPolicy(RandomPolicyConfig(observation=SMALL))
    server = PolicyServer(policy, ServerConfig(port=0, batch_window_ms=0))
    with caplog.at_level("ERROR", logger="longboat.serve"), serving_in_thread(server) as port:
        broken = {**small_obs(), "observation/state": np.full(8, 99, np.float32)}
        reply = _refused(port, msgpack_numpy.packb(broken))
        good = WebsocketClientPolicy("127.0.0.1", port)
        for i in range(20):
            good.infer({**small_obs(i), "seed": i})
    assert "Traceback" not in reply and "/srv/secret" not in reply and "RuntimeError" not in reply
    error_id = re.search(r"error id ([0-9a-f]+)", reply)[1]
    logged = [r.getMessage() for r in caplog.records if error_id in r.getMessage()]
    assert len(logged) == 1 and "Traceback" in logged[0] and "/srv/secret/model.py" in logged[0]
    # one entry per batch size, not per forward pass, however long the server runs
    assert server.stats.batch_sizes == {1: 20} and server.stats.forward_passes == 20


def test_observations_are_checked_against_the_policy_before_a_batch(served, tmp_path):
    server, port = served
    nan_state = np.full(8, np.nan, np.float32)
    cases = {
        "'observation/state': expected finite numbers": {**small_obs(), "observation/state": nan_state},
        "'observation/image': expected finite numbers": {**small_obs(), "observation/image":
                                                         np.full((32, 32, 3), np.inf, np.float32)},
        "3 NaN, infinite or too large of 8": {**small_obs(), "observation/state":
                                              np.array([1e300, -1e300, np.nan, 0, 0, 0, 0, 0])},
        "'prompt': expected a string, got int": {**small_obs(), "prompt": 3},
        "'observation/state': expected a numeric array, got str": {**small_obs(), "observation/state": "8 zeros"},
        "'observation/image': expected a numeric array, got dtype bool": {
            **small_obs(), "observation/image": np.zeros((32, 32, 3), bool)},
    }
    for match, obs in cases.items():
        assert match in _refused(port, msgpack_numpy.packb(obs))
    assert server.stats.forward_passes == 0  # none reached the policy
    # an export checks the same way
    from longboat.serving.served import RequestError
    from longboat.recipes.serve import open_served_policy
    from tests.serving.conftest import mlp_export

    export = open_served_policy(mlp_export(tmp_path / "export", state_dim=8))
    with pytest.raises(RequestError, match="'observation.state': expected finite numbers"):
        export.check({"observation.state": nan_state})


@pytest.mark.parametrize("args, code, message", [
    (["--host", "no.such.host.invalid"], 2, "--host no.such.host.invalid: cannot resolve"),
    (["--host", "192.0.2.1"], 2, "--host 192.0.2.1: not an address of this machine"),  # TEST-NET-1: nobody's
    (["--device", "foo"], 2, "--device foo: not a device to serve on"),
    (["--device", "cuda:99"], 2, "--device cuda:99: this machine has"),
    (["--port", "BUSY"], 1, "already in use on 127.0.0.1"),
])
def test_serve_bad_input_is_one_error_line(args, code, message, capsys):
    from longboat.cli.main import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        args = [str(busy.getsockname()[1]) if a == "BUSY" else a for a in args]
        assert main(["serve", "--random-policy", *args]) == code
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err, err


@pytest.mark.parametrize("spec, message", [
    ('{"a": ' + "[" * 100_000, "--random-policy: JSON nested too deeply to read"),
    ("[" * 100_000, "is neither a file nor an inline JSON object"),
    ("{'a': 1}", "--random-policy: not valid JSON"),
])
def test_a_random_policy_spec_that_is_not_json_is_one_error_line(spec, message, capsys):
    from longboat.cli.main import main

    assert main(["serve", "--random-policy", spec]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
