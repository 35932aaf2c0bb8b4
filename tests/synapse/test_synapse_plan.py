"""Plans: a node's dependencies come from its job's Output fields; the plan orders and checks
them."""

import pytest
from synapse_helpers import ConcatJob, diamond_plan

from synapse import Node, Output, Plan, PlanError, job_inputs


def job(*deps: str) -> ConcatJob:
    return ConcatJob("s", tuple(Output(d) for d in deps))


def test_plan_orders_dependencies_first_and_keeps_given_order_for_ties():
    plan = Plan(
        [
            Node("compile", job("import", "weights")),
            Node("weights", job("resolve")),
            Node("import", job("resolve")),
            Node("resolve", job()),
        ]
    )
    assert plan.topological_order() == ["resolve", "weights", "import", "compile"]
    assert plan.dependents("resolve") == ("weights", "import")
    assert [n.id for n in plan] == plan.topological_order()


def test_duplicate_id_is_rejected():
    with pytest.raises(PlanError, match="duplicate node id 'a'"):
        Plan([Node("a", job()), Node("a", job())])


def test_unknown_dependency_is_rejected():
    with pytest.raises(PlanError, match="node 'b' depends on unknown node 'missing'"):
        Plan([Node("a", job()), Node("b", job("missing"))])


def test_cycle_is_named():
    with pytest.raises(PlanError, match=r"dependency cycle: (a -> c -> b -> a|b -> a -> c -> b)"):
        Plan(
            [
                Node("a", job("c")),
                Node("b", job("a")),
                Node("c", job("b")),
                Node("d", job("a")),  # downstream of the cycle, not part of it
            ]
        )


def test_self_dependency_is_a_cycle():
    with pytest.raises(PlanError, match="dependency cycle: a -> a"):
        Plan([Node("a", job("a"))])


def test_a_node_needs_a_job_value_and_a_non_empty_id():
    """The job is the whole description of the work: a closure or a dict is not one."""
    with pytest.raises(PlanError, match=r"node 'a': its job must be a synapse\.Job dataclass"):
        Node("a", lambda ctx: None)
    with pytest.raises(PlanError, match="node id must be a non-empty string"):
        Node("", job())


def test_node_inputs_and_deps_are_read_only_and_come_from_the_job():
    node = Node("a", job("b", "b"))
    assert node.inputs == job_inputs(node.job) and set(node.inputs) == {"source", "deps"}
    assert node.deps == ("b",)  # named twice, depended on once
    assert node.kind == "concat"
    with pytest.raises(TypeError):
        node.inputs["source"] = "changed"
    assert len({node, Node("a", job("b"))}) == 2  # hashable, by identity


def test_describe_lists_nodes_in_execution_order():
    assert diamond_plan().describe().splitlines() == [
        "plan: 5 nodes",
        "  node     kind     flags     deps",
        "  resolve  resolve  -         -",
        "  import   import   -         resolve",
        "  weights  weights  -         resolve",
        "  compile  compile  heavy     import, weights",
        "  compose  compose  uncached  compile",
    ]
