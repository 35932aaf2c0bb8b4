import pytest

from synapse import Node, Plan, PlanError


def noop(ctx):
    pass


def test_plan_orders_dependencies_first_and_keeps_given_order_for_ties():
    plan = Plan(
        [
            Node("compile", "compile", noop, deps=("import", "weights")),
            Node("weights", "weights", noop, deps=("resolve",)),
            Node("import", "import", noop, deps=("resolve",)),
            Node("resolve", "resolve", noop),
        ]
    )
    assert plan.topological_order() == ["resolve", "weights", "import", "compile"]
    assert plan.dependents("resolve") == ("weights", "import")
    assert [n.id for n in plan] == plan.topological_order()


def test_duplicate_id_is_rejected():
    with pytest.raises(PlanError, match="duplicate node id 'a'"):
        Plan([Node("a", "k", noop), Node("a", "k", noop)])


def test_unknown_dependency_is_rejected():
    with pytest.raises(PlanError, match="node 'b' depends on unknown node 'missing'"):
        Plan([Node("a", "k", noop), Node("b", "k", noop, deps=("missing",))])


def test_cycle_is_named():
    with pytest.raises(PlanError, match=r"dependency cycle: (a -> c -> b -> a|b -> a -> c -> b)"):
        Plan(
            [
                Node("a", "k", noop, deps=("c",)),
                Node("b", "k", noop, deps=("a",)),
                Node("c", "k", noop, deps=("b",)),
                Node("d", "k", noop, deps=("a",)),  # downstream of the cycle, not part of it
            ]
        )


def test_self_dependency_is_a_cycle():
    with pytest.raises(PlanError, match="dependency cycle: a -> a"):
        Plan([Node("a", "k", noop, deps=("a",))])


def test_node_inputs_must_be_string_fingerprints():
    with pytest.raises(PlanError, match="input 'flags' must map a str to a str"):
        Node("a", "k", noop, inputs={"flags": ["-O3"]})


def test_node_is_hashable_and_copies_its_inputs():
    inputs = {"source": "abc"}
    node = Node("a", "k", noop, deps=["b"], inputs=inputs)
    inputs["source"] = "changed"
    assert node.inputs == {"source": "abc"}
    assert node.deps == ("b",)
    assert hash(node) == hash(Node("a", "k", noop, deps=("b",), inputs={"source": "other"}))


def test_describe_lists_nodes_in_execution_order():
    plan = Plan(
        [
            Node("resolve:app", "resolve", noop),
            Node("compile:mlp:cpu", "compile", noop, deps=("resolve:app",), heavy=True),
            Node("compose", "compose", noop, deps=("compile:mlp:cpu",), cacheable=False),
        ]
    )
    assert plan.describe().splitlines() == [
        "plan: 3 nodes",
        "  node             kind     flags     deps",
        "  resolve:app      resolve  -         -",
        "  compile:mlp:cpu  compile  heavy     resolve:app",
        "  compose          compose  uncached  compile:mlp:cpu",
    ]
