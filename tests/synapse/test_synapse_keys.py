from synapse_helpers import diamond_plan

from synapse import Executor, Node, bytes_digest, file_digest, json_digest, node_key


def noop(ctx):
    pass


def test_digests_agree_and_json_ignores_key_order(tmp_path):
    data = bytes(range(256)) * 20_000  # several read chunks
    path = tmp_path / "weights.bin"
    path.write_bytes(data)
    assert file_digest(path) == bytes_digest(data)
    assert json_digest({"a": 1, "b": [1, 2]}) == json_digest({"b": [1, 2], "a": 1})
    assert json_digest({"a": 1}) != json_digest({"a": 2})
    assert json_digest({"out": tmp_path / "x"}) == json_digest({"out": str(tmp_path / "x")})


def test_node_key_is_stable_and_sensitive_to_each_part():
    node = Node("compile:mlp:cpu", "compile", noop, deps=("import",), inputs={"a": "1", "b": "2"})
    key = node_key(node, {"import": "k1"}, "iree=3.13.0")
    same = Node("compile:mlp:cpu", "compile", noop, deps=("import",), inputs={"b": "2", "a": "1"})
    assert node_key(same, {"import": "k1", "unrelated": "zz"}, "iree=3.13.0") == key
    assert len(key) == 64 and int(key, 16) >= 0

    variants = [
        node_key(node, {"import": "k2"}, "iree=3.13.0"),
        node_key(node, {"import": "k1"}, "iree=3.14.0"),
        node_key(
            Node("compile:mlp:cpu", "compile", noop, deps=("import",), inputs={"a": "1", "b": "3"}),
            {"import": "k1"},
            "iree=3.13.0",
        ),
        node_key(
            Node("compile:mlp:gpu", "compile", noop, deps=("import",), inputs={"a": "1", "b": "2"}),
            {"import": "k1"},
            "iree=3.13.0",
        ),
        node_key(
            Node("compile:mlp:cpu", "other", noop, deps=("import",), inputs={"a": "1", "b": "2"}),
            {"import": "k1"},
            "iree=3.13.0",
        ),
    ]
    assert len({key, *variants}) == 6


def test_changing_a_leaf_input_changes_only_it_and_its_dependents():
    executor = Executor(cache=None, salt="s")
    before = executor.keys(diamond_plan())
    after = executor.keys(diamond_plan({"import": "i2"}))
    assert before == executor.keys(diamond_plan())
    changed = {node_id for node_id in before if before[node_id] != after[node_id]}
    assert changed == {"import", "compile", "compose"}
