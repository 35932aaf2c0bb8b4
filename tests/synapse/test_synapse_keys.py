"""Keys: a node's key is its kind, job type, id, job fields, dependencies' keys and the salt."""

from synapse_helpers import ConcatJob, ImportJob, Recorder, diamond_plan

from synapse import Executor, Node, Output, bytes_digest, file_digest, json_digest, node_key


def test_digests_agree_and_json_ignores_key_order(tmp_path):
    data = bytes(range(256)) * 20_000  # several read chunks
    path = tmp_path / "weights.bin"
    path.write_bytes(data)
    assert file_digest(path) == bytes_digest(data)
    assert json_digest({"a": 1, "b": [1, 2]}) == json_digest({"b": [1, 2], "a": 1})
    assert json_digest({"a": 1}) != json_digest({"a": 2})
    assert json_digest({"out": tmp_path / "x"}) == json_digest({"out": str(tmp_path / "x")})


def test_node_key_is_stable_and_sensitive_to_each_part():
    def compile_node(node_id="compile:mlp:cpu", job_type=ConcatJob, source="s1"):
        return Node(node_id, job_type(source, (Output("import"),)))

    key = node_key(compile_node(), {"import": "k1"}, "iree=3.13.0")
    # An equal job built again gives the same key; keys of unrelated nodes do not enter it.
    assert node_key(compile_node(), {"import": "k1", "unrelated": "zz"}, "iree=3.13.0") == key
    assert len(key) == 64 and int(key, 16) >= 0

    variants = [
        node_key(compile_node(), {"import": "k2"}, "iree=3.13.0"),  # a dependency changed
        node_key(compile_node(), {"import": "k1"}, "iree=3.14.0"),  # the salt
        node_key(compile_node(source="s2"), {"import": "k1"}, "iree=3.13.0"),  # a job field
        node_key(compile_node("compile:mlp:gpu"), {"import": "k1"}, "iree=3.13.0"),  # the id
        node_key(compile_node(job_type=ImportJob), {"import": "k1"}, "iree=3.13.0"),  # the kind
    ]
    assert len({key, *variants}) == 6


def test_changing_a_leaf_input_changes_only_it_and_its_dependents():
    executor = Executor(cache=None, salt="s")
    before = executor.keys(diamond_plan())
    after = executor.keys(diamond_plan({"import": "i2"}))
    assert before == executor.keys(diamond_plan())
    changed = {node_id for node_id in before if before[node_id] != after[node_id]}
    assert changed == {"import", "compile", "compose"}


def test_test_instruments_do_not_enter_the_key():
    """Recorder and pacing are keyless fields of the helpers' jobs: a watched build is a hit."""
    executor = Executor(cache=None, salt="s")
    assert executor.keys(diamond_plan()) == executor.keys(diamond_plan(None, Recorder(), 0.5))
