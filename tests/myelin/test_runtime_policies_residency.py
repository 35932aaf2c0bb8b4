"""Weight residency, measured with RSS: a model whose 64 MiB table is far larger than what one
call reads (4 rows, 16 KiB). `resident` keeps every parameter page mapped; `streamed` and
`prefetch` give them back after load and after each call."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import myelin
from myelin.mln import MlnReader
from tests.conftest import build_app
from tests.myelin.runtime_policies_models import write_gather_app

pytestmark = pytest.mark.slow  # builds a 64 MiB model and starts three probes (~30 s)

TABLE_KIB = 64 * 1024

PROBE = textwrap.dedent("""
    import json, sys
    import numpy as np
    import myelin

    def mapping_rss_kib(path):
        total, inside = 0, False
        for line in open("/proc/self/smaps"):
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                inside = line.rstrip().endswith(path)
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
        return total

    def status_kib(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1])

    path, mode = sys.argv[1], sys.argv[2]
    model = myelin.Instance().load(path, residency=mode)  # verify=True reads every page
    after_load = mapping_rss_kib(path)
    session = model.session()
    ids = np.array([5, 700, 9000, 16383])
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak-RSS counter (VmHWM)
    before = status_kib("VmRSS")
    y = session.call("lookup", ids)
    call_peak = status_kib("VmHWM") - before
    after_call = mapping_rss_kib(path)
    want = np.arange(16384 * 1024, dtype=np.float32).reshape(16384, 1024)[ids]
    print(json.dumps({"after_load": after_load, "after_call": after_call,
                      "call_peak": call_peak, "correct": bool(np.array_equal(y, want))}))
""")


@pytest.fixture(scope="module")
def gather_mln(tmp_path_factory):
    root = tmp_path_factory.mktemp("gather")
    return build_app(write_gather_app(root), root / "gather.mln")


def probe(path, mode: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(path), mode], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def measured(gather_mln) -> dict[str, dict]:
    results = {mode: probe(gather_mln, mode) for mode in ("resident", "streamed", "prefetch")}
    for mode, r in results.items():
        print(
            f"{mode:9s} mapping RSS after load {r['after_load']:6d} KiB, after call "
            f"{r['after_call']:6d} KiB; process RSS peak during the call +{r['call_peak']} KiB"
        )
    return results


def test_the_artifact_records_the_policy_and_what_each_entrypoint_reads(gather_mln):
    with MlnReader(gather_mln) as r:
        assert r.manifest["policies"]["residency"] == "resident"
        (entry,) = r.manifest["variants"][0]["entrypoints"]
    assert entry["memory"]["parameters"] == [["emb", "table"]]


def test_resident_keeps_every_parameter_page_mapped(measured):
    r = measured["resident"]
    assert r["correct"]
    assert r["after_load"] >= TABLE_KIB and r["after_call"] >= TABLE_KIB


@pytest.mark.parametrize("mode", ["streamed", "prefetch"])
def test_streamed_and_prefetch_let_the_pages_go(measured, mode):
    r = measured[mode]
    assert r["correct"]
    assert r["after_load"] < TABLE_KIB / 64  # under 1 MiB of 64 MiB stays mapped
    assert r["after_call"] < TABLE_KIB / 64


def test_the_manifest_policy_applies_and_a_load_argument_overrides_it(gather_mln, tmp_path):
    import numpy as np

    from myelin.mln import MlnWriter

    streamed = tmp_path / "streamed.mln"
    with MlnReader(gather_mln) as reader:
        manifest = {k: v for k, v in reader.manifest.items() if k not in ("format", "sections")}
        manifest["policies"] = {**manifest["policies"], "residency": "streamed"}
        writer = MlnWriter(manifest)
        for name, section in reader.sections.items():
            writer.add_section(
                name, section.kind, np.frombuffer(bytes(reader.section_view(name)), np.uint8)
            )
        writer.write(streamed)
    assert myelin.Instance().load(streamed).residency.policy == "streamed"
    assert myelin.Instance().load(streamed, residency="resident").residency.policy == "resident"
    with pytest.raises(ValueError, match="unknown residency 'sometimes'"):
        myelin.Instance().load(streamed, residency="sometimes")


def test_resident_weights_can_be_locked_where_allowed(gather_mln):
    model = myelin.Instance().load(gather_mln, lock_weights=True)
    locked = 0
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                inside = line.rstrip().endswith(str(gather_mln))
            elif inside and line.startswith("Locked:"):
                locked += int(line.split()[1])
    if model.residency.locked:
        assert locked >= TABLE_KIB
    else:  # no CAP_IPC_LOCK and a small RLIMIT_MEMLOCK: mlock is refused, nothing is locked
        assert locked == 0
    model.close()
