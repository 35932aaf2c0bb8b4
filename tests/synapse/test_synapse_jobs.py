"""The job rules: a job's fields are its node's key, so a step cannot read what the key missed.

Each keyed field changes the key; a keyless field says why it cannot and does not; a bare path
is refused (where a file is says nothing of what it holds); files enter by content; the Output
fields are the dependencies; and jobs pickle, so a step can run in another process.
"""

import dataclasses
import enum
import multiprocessing
import pickle
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
import synapse_helpers
from synapse_helpers import (
    ConcatJob,
    FailJob,
    Flags,
    GatherJob,
    ImportJob,
    InspectJob,
    KitchenSinkJob,
    MemoryMeter,
    MeteredJob,
    Mode,
    ModelJob,
    Recorder,
    UnregisteredJob,
    WaitForCancelJob,
    run_job_elsewhere,
)

from synapse import (
    BuildFailed,
    Cache,
    Executor,
    InputFile,
    InputTree,
    Job,
    Node,
    NodeContext,
    Output,
    Plan,
    PlanError,
    bytes_digest,
    explain,
    job_inputs,
    keyed_fields,
    keyless,
    node_key,
    run_job,
    step,
)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def project(root: Path) -> tuple[InputFile, InputTree]:
    """A model file and the .py files beside it, as a PLeX app folder has."""
    write(root / "model.txt", "weights v1")
    write(root / "main.py", "import lib.util")
    write(root / "lib" / "util.py", "def f(): return 1")
    return InputFile(root / "model.txt"), InputTree(root, ".py")


def samples(tmp_path: Path) -> dict[type, Job]:
    """One job of every job type the helpers define, every field set."""
    model, sources = project(tmp_path / "app")
    outputs = (Output("a"),)
    concat = {
        t: t("s", outputs, recorder=Recorder(), sleep_s=0.1)
        for t in (ConcatJob, *ConcatJob.__subclasses__())
    }
    return {
        **concat,
        FailJob: FailJob(ValueError("x"), "partial.bin", outputs, threading.Event()),
        WaitForCancelJob: WaitForCancelJob(threading.Event(), threading.Event(), 0.1),
        InspectJob: InspectJob(Output("a")),
        MeteredJob: MeteredJob(MemoryMeter(), threading.Barrier(1), 0.1),
        GatherJob: GatherJob(
            Output("a"), (Output("b"), Output("c")), {"d": Output("d")}, Flags(1, Output("e"))
        ),
        ModelJob: ModelJob(model, sources, "main"),
        UnregisteredJob: UnregisteredJob("s"),
        KitchenSinkJob: sink(model, sources),
    }


def sink(model: InputFile, sources: InputTree) -> KitchenSinkJob:
    return KitchenSinkJob(
        text="t",
        count=3,
        ratio=0.5,
        enabled=True,
        maybe=None,
        mode=Mode.FAST,
        blob=b"\x00\x01",
        names=("a", "b"),
        tags=frozenset({"x", "y"}),
        options={"o": 1, "p": 2},
        flags=Flags(2, Output("f"), note="n"),
        model=model,
        sources=sources,
        source=Output("a"),
        destination=Path("/tmp/out.bin"),
        label="sink",
    )


def perturbed(value, scratch: Path):
    """Another value of the same kind; a field of a kind not handled here fails the test, so a
    new kind of field gets a perturbation before it can be trusted to enter the key."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "'"
    if value is None:
        return "now set"
    if isinstance(value, enum.Enum):
        members = list(type(value))
        return members[(members.index(value) + 1) % len(members)]
    if isinstance(value, bytes):
        return value + b"!"
    if isinstance(value, tuple):
        return (*value[:-1], perturbed(value[-1], scratch))
    if isinstance(value, frozenset):
        first = min(value)
        return (value - {first}) | {perturbed(first, scratch)}
    if isinstance(value, dict):
        first = min(value)
        return {**value, first: perturbed(value[first], scratch)}
    if isinstance(value, Output):
        return Output(value.node_id + "2")
    if isinstance(value, InputFile):  # same name, other bytes
        return InputFile(write(scratch / "file" / value.path.name, value.path.read_text() + "!"))
    if isinstance(value, InputTree):  # the same tree with one file edited
        root = scratch / "tree"
        shutil.copytree(value.root, root)
        edited = value.files()[-1].relative_to(value.root)
        write(root / edited, (root / edited).read_text() + "\n# edited")
        return InputTree(root, value.suffix)
    if dataclasses.is_dataclass(value):
        first = keyed_fields(type(value))[0].name
        return dataclasses.replace(value, **{first: perturbed(getattr(value, first), scratch)})
    raise AssertionError(f"no perturbation for a {type(value).__name__}: add one")


def key_of(job: Job) -> str:
    node = Node("n", job)
    return node_key(node, {dep: bytes_digest(dep.encode()) for dep in node.deps}, "salt")


def test_every_job_type_of_the_helpers_has_a_sample(tmp_path):
    """So the key-completeness test below covers every job type, including new ones."""
    defined = {
        v
        for v in vars(synapse_helpers).values()
        if isinstance(v, type) and issubclass(v, Job) and v is not Job
    }
    assert defined == set(samples(tmp_path))


def test_every_keyed_field_enters_the_key_and_no_keyless_one_does(tmp_path):
    """Walks `dataclasses.fields` of each job type, so a field added later cannot be missed."""
    for job_type, job in samples(tmp_path / "samples").items():
        inputs, key = job_inputs(job), key_of(job)
        keyed = {f.name for f in keyed_fields(job_type)}
        assert set(inputs) == keyed
        for f in dataclasses.fields(job_type):
            scratch = tmp_path / "scratch" / job_type.__name__ / f.name
            where = f"{job_type.__name__}.{f.name}"
            if f.name in keyed:
                other = dataclasses.replace(
                    job, **{f.name: perturbed(getattr(job, f.name), scratch)}
                )
                changed = {k for k, v in job_inputs(other).items() if v != inputs[k]}
                assert changed == {f.name}, where
                assert key_of(other) != key, where
            else:
                assert f.metadata["synapse.keyless"], where  # says why
                other = dataclasses.replace(job, **{f.name: object()})  # nothing of it is read
                assert job_inputs(other) == inputs and key_of(other) == key, where


def test_keyless_needs_a_reason():
    with pytest.raises(PlanError, match=r"keyless\(why\): say why"):
        keyless("")
    assert [f.name for f in keyed_fields(ConcatJob)] == ["source", "deps"]
    assert [f.name for f in keyed_fields(Flags)] == ["opt_level", "source"]  # nested: the same


@dataclass(frozen=True)
class WeightsPathJob(Job):
    """Refused: a path in a key would say where the weights are, not what they are."""

    kind = "weights"
    weights: Path


@dataclass(frozen=True)
class SourcesPathJob(Job):
    kind = "import"
    sources: tuple[Path, ...]


def test_a_bare_path_is_refused_with_the_field_named(tmp_path):
    weights = write(tmp_path / "w.bin", "w")
    with pytest.raises(PlanError, match=r"WeightsPathJob\.weights is a path .*wrap it in"):
        Node("w", WeightsPathJob(weights))
    with pytest.raises(PlanError, match=r"SourcesPathJob\.sources\[1\] is a path"):
        Node("i", SourcesPathJob(("a.py", weights)))
    with pytest.raises(PlanError, match=r"KitchenSinkJob\.text: a object cannot enter a key"):
        Node("s", dataclasses.replace(sink(*project(tmp_path / "app")), text=object()))


def test_a_file_enters_by_content_not_by_path(tmp_path):
    """A moved project stays cached; an edited file, or a new .py file beside it, does not."""
    cache, salt = Cache(tmp_path / "cache"), "s"

    def build(root: Path):
        model, sources = InputFile(root / "model.txt"), InputTree(root, ".py")
        results = Executor(cache, salt=salt).run(Plan([Node("import", ModelJob(model, sources))]))
        return explain(results)[0], (results["import"].out_dir / "out.txt").read_text()

    project(tmp_path / "app")
    assert build(tmp_path / "app") == (
        "import  built: no cache entry (first build)",
        "main: weights v1 [lib/util.py, main.py]",
    )
    shutil.move(tmp_path / "app", tmp_path / "moved")
    moved = tmp_path / "moved"
    assert build(moved)[0] == "import  hit"

    write(moved / "notes.txt", "not a .py file")
    write(moved / "__pycache__" / "main.py", "bytecode's neighbour")
    write(moved / ".venv" / "lib" / "site.py", "a hidden folder")
    assert build(moved)[0] == "import  hit"

    write(moved / "lib" / "util.py", "def f(): return 2")
    assert build(moved)[0] == "import  rebuilt: input 'sources' changed"
    write(moved / "lib" / "extra.py", "X = 1")
    assert build(moved) == (
        "import  rebuilt: input 'sources' changed",
        "main: weights v1 [lib/extra.py, lib/util.py, main.py]",
    )
    write(moved / "model.txt", "weights v2")
    assert build(moved)[0] == "import  rebuilt: input 'model' changed"


def gather_plan(e_source: str = "e", with_e: bool = True) -> Plan:
    leaves = [Node(n, ConcatJob(n if n != "e" else e_source)) for n in "abcde"]
    gather = GatherJob(
        Output("a"), (Output("b"), Output("c")), {"d": Output("d")}, Flags(1, Output("e"))
    )
    return Plan([*(leaves if with_e else leaves[:-1]), Node("g", gather)])


def test_dependencies_come_from_output_fields_wherever_they_sit(tmp_path):
    plan = gather_plan()
    assert plan.nodes["g"].deps == ("a", "b", "c", "d", "e")  # field order: tuple, dict, nested
    cache = Cache(tmp_path / "cache")
    results = Executor(cache).run(plan)
    assert (results["g"].out_dir / "out.txt").read_text() == "(a) + (b) + (c) + (d) + (e)"

    again = Executor(cache).run(gather_plan(e_source="e2"))
    assert explain(again)[-2:] == [
        "e  rebuilt: input 'source' changed",
        "g  rebuilt: dependency 'e' changed",
    ]
    with pytest.raises(PlanError, match="node 'g' depends on unknown node 'e'"):
        gather_plan(with_e=False)


def test_jobs_pickle_and_run_the_same_in_a_spawned_process(tmp_path):
    """A job carries everything its step needs: another process finds the step by the job's
    type and writes the same output."""
    model, sources = project(tmp_path / "app")
    plan = Plan([*gather_plan(), Node("import", ModelJob(model, sources))])
    results = Executor(None, workdir=tmp_path / "work").run(plan)
    for node_id in ("g", "import"):
        job = plan.nodes[node_id].job
        assert pickle.loads(pickle.dumps(job)) == job
        assert job_inputs(pickle.loads(pickle.dumps(job))) == job_inputs(job)

    spawn = multiprocessing.get_context("spawn")
    with spawn.Pool(1) as pool:
        for node_id in ("g", "import"):
            node, out = plan.nodes[node_id], tmp_path / "elsewhere" / node_id
            out.mkdir(parents=True)
            deps = {dep: str(results[dep].out_dir) for dep in node.deps}
            text = pool.apply(run_job_elsewhere, (node.job, node_id, str(out), deps))
            assert text == (results[node_id].out_dir / "out.txt").read_text()
            assert (out / "out.txt").read_text() == text


def test_a_job_type_without_a_step_is_a_clear_error(tmp_path):
    job = UnregisteredJob("s")
    ctx = NodeContext(Node("o", job), tmp_path, {}, threading.Event())
    message = r"no step is registered for UnregisteredJob; decorate .* @synapse\.step\("
    with pytest.raises(PlanError, match=message):
        run_job(job, ctx)
    with pytest.raises(BuildFailed) as caught:
        Executor(None, workdir=tmp_path).run(Plan([Node("o", job)]))
    assert isinstance(caught.value.error, PlanError)


def test_step_needs_a_frozen_dataclass_and_one_function_per_type():
    @dataclass
    class MutableJob(Job):
        source: str

    with pytest.raises(PlanError, match="MutableJob must be a frozen dataclass"):
        step(MutableJob)(lambda job, ctx: None)
    with pytest.raises(PlanError, match="ConcatJob already runs through run_concat"):
        step(ConcatJob)(lambda job, ctx: None)
    step(ImportJob)(synapse_helpers.run_concat)  # the same function again is no conflict
