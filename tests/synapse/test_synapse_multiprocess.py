import multiprocessing

from synapse_helpers import diamond_plan, run_diamond_in_process

from synapse import Cache, Executor


def test_two_processes_share_one_cache(tmp_path):
    """Both build the same plan at once on one cache folder: both succeed, entries stay whole."""
    root = tmp_path / "cache"
    spawn = multiprocessing.get_context("spawn")
    barrier, queue = spawn.Barrier(2), spawn.Queue()
    workers = [
        spawn.Process(target=run_diamond_in_process, args=(str(root), barrier, queue))
        for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    reports = [queue.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0

    expected_output = "(x (c (i (r)) (w (r))))"
    for report in reports:
        assert report["compose"] == ("built", expected_output)
        assert all(status in ("built", "hit") for status, _ in report.values())

    cache = Cache(root)
    entries = cache.ls()
    assert sorted(e.node_id for e in entries) == ["compile", "import", "resolve", "weights"]
    assert all(cache.get(e.key) == e.path for e in entries)  # every entry passes its check
    assert list((root / "tmp").iterdir()) == []  # the loser's staging folders are gone

    again = Executor(cache, salt="test").run(diamond_plan())
    assert {r.status for node_id, r in again.items() if node_id != "compose"} == {"hit"}
