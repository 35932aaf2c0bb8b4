"""The Ray executor keeps a cluster closed: it will not put its shared cache (a detached actor
that stores build outputs for every driver) on a cluster that anyone can reach, and a cluster
with Ray's token authentication refuses a driver without the token.

The socket bindings of a loopback cluster are checked by `ss` in
tests/plex/test_build_ray_cluster.py (`test_every_connection_stays_on_loopback`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("ray")

from synapse._ray import exposure


def _node(address: str, alive: bool = True) -> dict[str, object]:
    return {"NodeManagerAddress": address, "Alive": alive}


def test_an_unauthenticated_cluster_beyond_loopback_is_exposed():
    nodes = [_node("127.0.0.1"), _node("10.0.0.7"), _node("10.0.0.7")]
    assert exposure(nodes, token_auth=False) == (
        "the cluster runs without authentication (RAY_AUTH_MODE is not 'token' here) and its "
        "nodes listen on 10.0.0.7, beyond loopback"
    )
    # 127.0.0.2 is loopback, but Ray binds a node with that address to every interface.
    assert "127.0.0.2" in exposure([_node("127.0.0.2")], token_auth=False)


def test_token_authentication_or_a_loopback_only_cluster_is_not_exposed():
    assert exposure([_node("10.0.0.7")], token_auth=True) is None
    assert exposure([_node("127.0.0.1"), _node("10.0.0.7", alive=False)], False) is None


DRIVER = textwrap.dedent("""\
    import sys
    import ray

    try:
        ray.init(address=sys.argv[1], log_to_driver=False)
        print("connected", ray.get(ray.put(1)))
    except Exception as e:
        print("refused", type(e).__name__, str(e).splitlines()[0][:200])
""")

HEAD = textwrap.dedent("""\
    import sys
    import time

    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False,
                        "object_store_memory": 80_000_000},
    )
    print(cluster.address, flush=True)
    sys.stdin.read()  # until the test closes our stdin
    cluster.shutdown()
""")


@pytest.mark.slow
def test_a_token_authenticated_cluster_refuses_a_driver_without_the_token(tmp_path):
    token = "plex-test-token-" + os.urandom(8).hex()
    base = {
        **os.environ,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # keep every address on 127.0.0.1
        "RAY_USAGE_STATS_ENABLED": "0",
        "HOME": str(tmp_path),  # no ~/.ray/auth_token of the user's is read or written
    }
    secured = {**base, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    head = subprocess.Popen(
        [sys.executable, "-c", HEAD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=secured,
    )
    try:
        assert head.stdout is not None
        address = head.stdout.readline().strip()
        assert address, "the token-authenticated cluster did not start"

        def driver(env: dict[str, str]) -> str:
            done = subprocess.run(
                [sys.executable, "-c", DRIVER, address],
                capture_output=True,
                text=True,
                env=env,
                timeout=180,
            )
            return done.stdout.strip()

        assert driver(secured).startswith("connected 1")
        # A refused driver tries the GCS RAY_NUM_REDIS_GET_RETRIES times, a second apart (20 s
        # by default); the cluster has just taken the secured driver, so 3 tries say the same.
        refused_soon = {"RAY_NUM_REDIS_GET_RETRIES": "3"}
        unauthenticated = {**base, **refused_soon, "RAY_AUTH_MODE": "disabled"}
        assert driver(unauthenticated).startswith("refused"), "a driver without the token ran"
        wrong = {**secured, **refused_soon, "RAY_AUTH_TOKEN": "not-" + token}
        assert driver(wrong).startswith("refused"), "a driver with a wrong token ran"
    finally:
        assert head.stdin is not None
        head.stdin.close()
        try:
            head.wait(timeout=120)
        except subprocess.TimeoutExpired:
            head.kill()
