"""The .mln container: what the writer produces and everything the reader refuses.

Module bytes here are fake (no IREE): the container does not look inside its sections.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
import struct
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from myelin.errors import ArtifactError
from myelin.mln import (
    HEADER_SIZE,
    MAGIC,
    PARAMETER_PAGE,
    SECTION_ALIGNMENT,
    MlnReader,
    MlnWriter,
    module_section_name,
    parameter_section_name,
)
from myelin.runtime.parameter_memory import parameter_pages

MODULE = module_section_name("cpu", "mlp")  # "variant/cpu/module/mlp"
W0 = parameter_section_name("model", "w0")  # "param/model/w0"
B0 = parameter_section_name("model", "b0")
HEADER = struct.Struct("<8sHHIQQ32s")  # written out here as the doc states it, not imported

W0_DATA = np.arange(128, dtype=np.float32).reshape(16, 8)
B0_DATA = np.linspace(-1, 1, 8, dtype=np.float32)
MODULE_DATA = b"fake VM bytecode " * 7
BLOB_DATA = b'{"tokenizer": true}'


def demo_manifest() -> dict:
    return {
        "app": {"name": "demo", "version": "0.1.0"},
        "variants": [
            {
                "name": "cpu",
                "devices": [
                    {
                        "name": "cpu",
                        "target": "llvm-cpu",
                        "driver": "local-task",
                        "options": {"cpu": "host"},
                        "requires": {"cpu_flags": ["avx2", "fma"]},
                    }
                ],
                "modules": [{"name": "mlp", "section": MODULE}],
                "entrypoints": [
                    {
                        "name": "forward",
                        "module": "mlp",
                        "function": "forward",
                        "inputs": [
                            {
                                "name": "x",
                                "dtype": "float32",
                                "shape": [None, 16],
                                "dims": ["batch", 16],
                            }
                        ],
                        "outputs": [
                            {
                                "name": "output0",
                                "dtype": "float32",
                                "shape": [None, 8],
                                "dims": ["?0", 8],
                            }
                        ],
                    }
                ],
                "parameter_scopes": ["model"],
                "flags": ["--iree-hal-target-device=local"],
            }
        ],
        "parameters": [
            {
                "scope": "model",
                "key": "w0",
                "section": W0,
                "offset": 0,
                "length": 512,
                "codec": "fp32",
                "dtype": "float32",
                "shape": [16, 8],
                "layout": "dense",
            },
            {
                "scope": "model",
                "key": "b0",
                "section": B0,
                "offset": 0,
                "length": 32,
                "codec": "fp32",
                "dtype": "float32",
                "shape": [8],
                "layout": "dense",
            },
        ],
        "tuning": None,
        "provenance": {
            "plex_version": "0.1.0",
            "iree_compiler_version": "3.13.0",
            "sources": {"mlp:mlp": "ab" * 32},
        },
    }


def build(path: Path, manifest: dict | None = None) -> Path:
    writer = MlnWriter(demo_manifest() if manifest is None else manifest)
    writer.add_section(MODULE, "module", MODULE_DATA)
    writer.add_section(W0, "parameter", W0_DATA)
    writer.add_section(B0, "parameter", B0_DATA)
    writer.add_section("blob/tokenizer", "blob", BLOB_DATA)
    return writer.write(path)


def header_of(path: Path) -> tuple:
    return HEADER.unpack(path.read_bytes()[:HEADER_SIZE])


def manifest_of(path: Path) -> dict:
    with MlnReader(path, verify=False) as reader:
        return copy.deepcopy(reader.manifest)


def replace_manifest(
    path: Path,
    manifest: dict | None = None,
    *,
    raw: bytes | None = None,
    major: int = 1,
    minor: int = 1,
    flags: int = 0,
) -> None:
    """Hand-craft a file: swap in a new manifest and give the header its valid hash."""
    data = path.read_bytes()
    offset = header_of(path)[4]
    body = raw if raw is not None else json.dumps(manifest, separators=(",", ":")).encode()
    digest = hashlib.sha256(body).digest()
    header = HEADER.pack(MAGIC, major, minor, flags, offset, len(body), digest)
    path.write_bytes(header + data[HEADER_SIZE:offset] + body)


def flip(path: Path, position: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= mask
    path.write_bytes(bytes(data))


def refused(path: Path, *match: str) -> str:
    """Open `path`, expect ArtifactError naming the file and every fragment of `match`."""
    with pytest.raises(ArtifactError) as caught:
        MlnReader(path)
    message = str(caught.value)
    assert str(path) in message
    for fragment in match:
        assert fragment in message
    return message


# --- writing and reading back --------------------------------------------------------------------


def test_round_trip(tmp_path):
    path = build(tmp_path / "demo.mln")
    with MlnReader(path) as reader:
        expected = demo_manifest()
        assert {k: v for k, v in reader.manifest.items() if k not in ("format", "sections")} == (
            expected
        )
        assert reader.manifest["format"] == {"major": 1, "minor": 1}
        assert reader.format_version == (1, 1)
        assert list(reader.sections) == [MODULE, W0, B0, "blob/tokenizer"]
        assert bytes(reader.section_view(MODULE)) == MODULE_DATA
        assert bytes(reader.section_view("blob/tokenizer")) == BLOB_DATA
        w0 = np.frombuffer(reader.section_view(W0), dtype=np.float32).reshape(16, 8)
        np.testing.assert_array_equal(w0, W0_DATA)
        np.testing.assert_array_equal(np.frombuffer(reader.section_view(B0), np.float32), B0_DATA)
        for section in reader.sections.values():
            assert section.alignment == SECTION_ALIGNMENT[section.kind]
            assert section.offset % section.alignment == 0
            assert section.sha256 == hashlib.sha256(reader.section_view(section.name)).hexdigest()
        assert reader.sections[W0].offset == 4096 and reader.sections[B0].offset == 8192
        assert reader.file_size == path.stat().st_size
        del w0  # views must go before close() can unmap


def test_header_layout_and_manifest_encoding(tmp_path):
    path = build(tmp_path / "demo.mln")
    magic, major, minor, flags, offset, length, digest = header_of(path)
    assert (magic, major, minor, flags) == (MAGIC, 1, 1, 0)
    body = path.read_bytes()[offset:]
    assert len(body) == length and offset % 64 == 0  # the manifest is last
    assert hashlib.sha256(body).digest() == digest
    manifest = json.loads(body)
    assert body == json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()


def test_the_pages_of_the_parameters_lie_inside_the_file(tmp_path):
    """After parameters the manifest starts on a page, so the runtime wraps the parameters in
    whole pages that a device can import (myelin.runtime.parameter_memory.parameter_pages)."""
    path = build(tmp_path / "demo.mln")
    assert header_of(path)[4] % PARAMETER_PAGE == 0
    with MlnReader(path) as reader:
        params = [s for s in reader.sections.values() if s.kind == "parameter"]
        start, end = parameter_pages(params, reader.file_size)
    assert (start, end) == (4096, 12288)  # w0's page and b0's, the last one whole
    assert end <= path.stat().st_size
    # Without parameters there is nothing to import: the manifest keeps the 64-byte alignment.
    manifest = demo_manifest()
    manifest["parameters"] = []
    writer = MlnWriter(manifest)
    writer.add_section(MODULE, "module", MODULE_DATA)
    assert header_of(writer.write(tmp_path / "code.mln"))[4] == 192  # 64 + 119, on 64


def test_section_view_is_zero_copy_into_the_map(tmp_path):
    with MlnReader(build(tmp_path / "demo.mln")) as reader:
        view = reader.section_view(W0)
        assert view.readonly and view.obj is reader.mmap
        assert np.frombuffer(view, np.float32).base is not None  # wraps, does not copy
        del view


def test_two_writes_are_byte_identical(tmp_path):
    first = build(tmp_path / "a.mln").read_bytes()
    second = build(tmp_path / "b.mln").read_bytes()
    assert first == second


def test_writer_overwrites_atomically_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "demo.mln"
    path.write_bytes(b"old contents")
    build(path)
    assert MlnReader(path).manifest["app"]["name"] == "demo"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.mln"]


def test_scalar_arguments_have_null_shape(tmp_path):
    manifest = demo_manifest()
    scalar = {"name": "temperature", "dtype": "float32", "shape": None, "dims": []}
    manifest["variants"][0]["entrypoints"][0]["inputs"].append(scalar)
    with MlnReader(build(tmp_path / "demo.mln", manifest)) as reader:
        assert reader.manifest["variants"][0]["entrypoints"][0]["inputs"][1] == scalar


def test_non_contiguous_array_is_stored_c_contiguous(tmp_path):
    manifest = demo_manifest()
    writer = MlnWriter(manifest)
    writer.add_section(MODULE, "module", MODULE_DATA)
    writer.add_section(W0, "parameter", np.asfortranarray(W0_DATA))
    writer.add_section(B0, "parameter", W0_DATA[:, 0][:8])  # strided
    path = writer.write(tmp_path / "demo.mln")
    with MlnReader(path) as reader:
        assert bytes(reader.section_view(W0)) == W0_DATA.tobytes()
        assert bytes(reader.section_view(B0)) == W0_DATA[:, 0][:8].tobytes()


def test_path_section_is_streamed_not_loaded(tmp_path):
    weights = tmp_path / "weights.bin"
    data = np.random.default_rng(0).integers(0, 256, 20 * 1024 * 1024, dtype=np.uint8)
    data.tofile(weights)
    manifest = demo_manifest()
    manifest["parameters"][0].update(length=data.size, shape=[data.size // 4])
    writer = MlnWriter(manifest)
    writer.add_section(MODULE, "module", MODULE_DATA)
    writer.add_section(W0, "parameter", weights)
    writer.add_section(B0, "parameter", B0_DATA)
    del data
    tracemalloc.start()
    try:
        writer.write(tmp_path / "big.mln")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 12 * 1024 * 1024  # a 4 MiB chunk buffer, never the 20 MiB file
    with MlnReader(tmp_path / "big.mln") as reader:
        view = reader.section_view(W0)
        assert hashlib.sha256(view).digest() == hashlib.sha256(weights.read_bytes()).digest()
        assert reader.sections[W0].offset % 4096 == 0
        del view


def test_parallel_verification_finds_the_corrupt_section(tmp_path, monkeypatch):
    path = build(tmp_path / "demo.mln")
    monkeypatch.setattr("myelin.mln._reader._PARALLEL_VERIFY_BYTES", 0)
    MlnReader(path)
    flip(path, 8192 + 3)
    refused(path, f"section '{B0}' is corrupt (sha256 mismatch)")


# --- damaged files -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        (lambda h: 0, "not a .mln file"),
        (lambda h: 5, "not a .mln file"),
        (lambda h: 8, "format version 0.1; this runtime reads 1.x — rebuild with this PLeX"),
        (lambda h: 9, "format version 257.1"),
        (lambda h: 12, "and a 144-byte signature but the file is"),  # FLAG_SIGNED, no trailer
        (lambda h: 16, "truncated: the header places the manifest"),
        (lambda h: 26, "truncated: the header places the manifest"),
        (lambda h: 40, "manifest is corrupt (sha256 mismatch)"),
        (lambda h: h[4] + 10, "manifest is corrupt (sha256 mismatch)"),
        (lambda h: 64, f"section '{MODULE}' is corrupt (sha256 mismatch); the file was damaged"),
        (
            lambda h: 4096 + 100,
            f"section '{W0}' is corrupt (sha256 mismatch); the file was damaged",
        ),
        (lambda h: 200, "padding at bytes"),
    ],
    ids=[
        "magic0",
        "magic5",
        "major",
        "major-high",
        "flags",
        "manifest-offset",
        "manifest-length",
        "manifest-hash",
        "manifest",
        "module",
        "parameter",
        "padding",
    ],
)
def test_one_flipped_byte_is_refused(tmp_path, where, expected):
    path = build(tmp_path / "demo.mln")
    flip(path, where(header_of(path)))
    refused(path, expected)


def test_minor_flip_in_header_disagrees_with_manifest(tmp_path):
    path = build(tmp_path / "demo.mln")
    flip(path, 10)
    refused(path, "manifest field format: says 1.1 but the header says 1.0")


def test_unknown_header_flag_is_refused(tmp_path):
    path = build(tmp_path / "demo.mln")
    flip(path, 12, 0x02)
    refused(path, "unknown header flags 0x00000002; this runtime knows 0x00000001")


def test_verify_false_defers_section_hashing(tmp_path):
    path = build(tmp_path / "demo.mln")
    flip(path, 4096)
    with MlnReader(path, verify=False) as reader:
        reader.verify_section(MODULE)
        with pytest.raises(ArtifactError, match=f"section '{W0}' is corrupt"):
            reader.verify_section(W0)
        with pytest.raises(ArtifactError, match=f"section '{W0}' is corrupt"):
            reader.verify_all()


@pytest.mark.parametrize(
    "keep",
    [
        "empty",
        "mid-magic",
        "mid-header",
        "after-header",
        "mid-parameter",
        "mid-manifest",
        "last-byte-missing",
    ],
)
def test_truncated_file_is_refused(tmp_path, keep):
    path = build(tmp_path / "demo.mln")
    data = path.read_bytes()
    manifest_offset = header_of(path)[4]
    size = {
        "empty": 0,
        "mid-magic": 5,
        "mid-header": 40,
        "after-header": 64,
        "mid-parameter": 4096 + 200,
        "mid-manifest": manifest_offset + 30,
        "last-byte-missing": len(data) - 1,
    }[keep]
    path.write_bytes(data[:size])
    refused(path, "truncated")


def test_not_an_mln_file(tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello, this is not an artifact at all, just some text.\n" * 3)
    refused(text, "not a .mln file")
    short = tmp_path / "short.bin"
    short.write_bytes(b"PK\x03\x04")
    refused(short, "not a .mln file")


def test_missing_file_and_folder(tmp_path):
    refused(tmp_path / "absent.mln", "cannot open")
    refused(tmp_path, "")  # a folder: cannot open / not a regular file


def test_newer_major_version_is_refused(tmp_path):
    path = build(tmp_path / "demo.mln")
    manifest = manifest_of(path)
    manifest["format"] = {"major": 2, "minor": 3}
    replace_manifest(path, manifest, major=2, minor=3)
    refused(path, "format version 2.3; this runtime reads 1.x")


def test_newer_minor_version_with_additions_is_read(tmp_path):
    path = build(tmp_path / "demo.mln")
    manifest = manifest_of(path)
    manifest["format"] = {"major": 1, "minor": 4}
    manifest["future_field"] = {"anything": [1, 2]}
    manifest["variants"][0]["entrypoints"][0]["future_hint"] = "x"
    manifest["sections"][3]["kind"] = "future-kind"  # unknown kinds from a newer minor are kept
    replace_manifest(path, manifest, minor=4)
    with MlnReader(path) as reader:
        assert reader.format_version == (1, 4)
        assert reader.sections["blob/tokenizer"].kind == "future-kind"
        assert bytes(reader.section_view("blob/tokenizer")) == BLOB_DATA


def test_oversized_manifest_is_refused(tmp_path):
    path = build(tmp_path / "demo.mln")
    data = bytearray(path.read_bytes())
    struct.pack_into("<Q", data, 24, 64 * 1024 * 1024 + 1)
    path.write_bytes(bytes(data))
    refused(path, "larger than the 67108864-byte limit")


def test_trailing_bytes_are_refused(tmp_path):
    path = build(tmp_path / "demo.mln")
    path.write_bytes(path.read_bytes() + b"\0" * 10)
    refused(path, "10 unexpected bytes after the manifest")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"\xff\xfe{}", "manifest is not valid UTF-8"),
        (b"{not json", "manifest is not valid JSON"),
        (b'{"a": NaN}', "manifest is not valid JSON: NaN"),
        (b'{"a": 1, "a": 2}', "duplicate key 'a'"),
        (b"[" * 100000 + b"]" * 100000, "manifest is not valid JSON"),
        (b"[1, 2]", "manifest must be an object"),
    ],
    ids=["utf8", "syntax", "nan", "duplicate-key", "deep", "not-object"],
)
def test_unparsable_manifest_is_refused(tmp_path, raw, expected):
    path = build(tmp_path / "demo.mln")
    replace_manifest(path, raw=raw)
    refused(path, expected)


def _set(path: tuple, value):
    def mutate(m):
        *parents, last = path
        for key in parents:
            m = m[key]
        m[last] = value

    return mutate


def _delete(path: tuple):
    def mutate(m):
        *parents, last = path
        for key in parents:
            m = m[key]
        del m[last]

    return mutate


def _append_copy(path: tuple):
    def mutate(m):
        for key in path:
            m = m[key]
        m.append(copy.deepcopy(m[0]))

    return mutate


ENTRY = ("variants", 0, "entrypoints", 0)


@pytest.mark.parametrize(
    ("mutate", "field", "problem"),
    [
        (_delete(("app", "name")), "app.name", "is missing"),
        (_set(("app",), "demo"), "app", "must be an object"),
        (_delete(("format",)), "format", "is missing"),
        (_set(("format", "minor"), 0), "format", "says 1.0 but the header says 1.1"),
        (_set(("format", "major"), True), "format.major", "must be an integer >= 0"),
        (_set(("tuning",), [1]), "tuning", "must be an object"),
        (_delete(("provenance",)), "provenance", "is missing"),
        (_set(("provenance", "sources"), {"a": 1}), "provenance.sources['a']", "non-empty string"),
        (_set(("sections", 1, "kind"), "weights"), "sections[1].kind", "unknown section kind"),
        (_set(("sections", 1, "sha256"), "AB" * 32), "sections[1].sha256", "64 lowercase hex"),
        (_set(("sections", 1, "offset"), 4160), "sections[1].offset", "not a multiple of"),
        (_set(("sections", 1, "alignment"), 64), "sections[1].alignment", "power of two >= 4096"),
        (_set(("sections", 1, "length"), -1), "sections[1].length", "integer >= 0, got -1"),
        (_set(("sections", 1, "name"), MODULE), "sections[1].name", "duplicate section name"),
        (
            _set(("parameters", 0, "section"), "param/model/nope"),
            "parameters[0].section",
            "names no section",
        ),
        (
            _set(("parameters", 0, "section"), MODULE),
            "parameters[0].section",
            "is of kind 'module', not 'parameter'",
        ),
        (
            _set(("parameters", 0, "length"), 513),
            "parameters[0]",
            "byte range 0..513 lies outside its section 'param/model/w0' (512 bytes)",
        ),
        (_set(("parameters", 0, "offset"), 500), "parameters[0]", "byte range 500..1012"),
        (_set(("parameters", 1, "key"), "w0"), "parameters[1]", "duplicate parameter"),
        (_set(("parameters", 0, "shape"), [16, None]), "parameters[0].shape[1]", "integer >= 0"),
        (_set(("parameters", 0, "dtype"), 4), "parameters[0].dtype", "non-empty string, got 4"),
        (_append_copy(("variants",)), "variants[1].name", "duplicate variant name 'cpu'"),
        (
            _set(("variants", 0, "devices", 0, "driver"), None),
            "variants[0].devices[0].driver",
            "non-empty string, got null",
        ),
        (
            _set(("variants", 0, "devices", 0, "requires", "cpu_flags"), "avx2"),
            "variants[0].devices[0].requires.cpu_flags",
            "must be a list",
        ),
        (
            _set(("variants", 0, "modules", 0, "section"), W0),
            "variants[0].modules[0].section",
            "is of kind 'parameter', not 'module'",
        ),
        (
            _append_copy(("variants", 0, "entrypoints")),
            "variants[0].entrypoints[1].name",
            "duplicate entrypoint name 'forward'",
        ),
        (
            _set((*ENTRY, "module"), "other"),
            "variants[0].entrypoints[0].module",
            "names no module of this variant: 'other'",
        ),
        (
            _set((*ENTRY, "device"), "gpu"),
            "variants[0].entrypoints[0].device",
            "names no device of this variant",
        ),
        (
            _set((*ENTRY, "inputs", 0, "shape", 1), -3),
            "variants[0].entrypoints[0].inputs[0].shape[1]",
            "integer >= 0 or null, got -3",
        ),
        (
            _set((*ENTRY, "inputs", 0, "shape", 1), "16"),
            "variants[0].entrypoints[0].inputs[0].shape[1]",
            "integer >= 0 or null, got '16'",
        ),
        (
            _set((*ENTRY, "outputs", 0, "dtype"), ["float32"]),
            "variants[0].entrypoints[0].outputs[0].dtype",
            "non-empty string",
        ),
        (
            _set((*ENTRY, "outputs", 0, "dims"), ["?0"]),
            "variants[0].entrypoints[0].outputs[0].dims",
            "has 1 entries but shape has 2",
        ),
        (
            _set((*ENTRY, "outputs", 0, "shape"), {"rank": 2}),
            "variants[0].entrypoints[0].outputs[0].shape",
            "must be a list, got {'rank': 2}",
        ),
        (
            _set((*ENTRY, "outputs", 0, "shape"), None),
            "variants[0].entrypoints[0].outputs[0].dims",
            "has 2 entries but shape has 0",
        ),
        (
            _delete(("variants", 0, "parameter_scopes")),
            "variants[0].parameter_scopes",
            "is missing",
        ),
    ],
)
def test_manifest_with_wrong_structure_names_the_field(tmp_path, mutate, field, problem):
    path = build(tmp_path / "demo.mln")
    manifest = manifest_of(path)
    mutate(manifest)
    replace_manifest(path, manifest)
    refused(path, f"manifest field {field}: ", problem)


@pytest.mark.parametrize(
    ("section", "offset", "expected"),
    [
        (2, 4096, "section 'param/model/w0' (bytes 4096..4608) overlaps section 'param/model/b0'"),
        (0, 0, "overlaps the header"),
        (3, 1 << 40, "overlaps the manifest"),
    ],
)
def test_sections_out_of_place_are_refused(tmp_path, section, offset, expected):
    path = build(tmp_path / "demo.mln")
    manifest = manifest_of(path)
    manifest["sections"][section]["offset"] = offset
    replace_manifest(path, manifest)
    refused(path, expected)


def test_section_reaching_into_the_manifest_is_refused(tmp_path):
    path = build(tmp_path / "demo.mln")
    manifest = manifest_of(path)
    manifest["sections"][3]["length"] += 4096
    replace_manifest(path, manifest)
    refused(path, "section 'blob/tokenizer'", "overlaps the manifest")


def test_random_byte_flips_never_escape_as_other_errors(tmp_path):
    original = build(tmp_path / "demo.mln")
    pristine = original.read_bytes()
    with MlnReader(original) as reader:
        manifest = copy.deepcopy(reader.manifest)
        contents = {name: bytes(reader.section_view(name)) for name in reader.sections}
    rng = random.Random(1234)
    target = tmp_path / "damaged.mln"
    refusals = 0
    for _ in range(200):
        data = bytearray(pristine)
        data[rng.randrange(len(data))] ^= rng.randrange(1, 256)
        target.write_bytes(bytes(data))
        try:
            reader = MlnReader(target)
        except ArtifactError as exc:
            assert str(target) in str(exc)
            refusals += 1
            continue
        with reader:  # only a flip in padding could get here
            assert reader.manifest == manifest
            assert {n: bytes(reader.section_view(n)) for n in reader.sections} == contents
    assert refusals == 200  # padding is checked too, so every flip is caught


# --- reader API ----------------------------------------------------------------------------------


def test_unknown_section_and_closed_reader(tmp_path):
    reader = MlnReader(build(tmp_path / "demo.mln"))
    with pytest.raises(ArtifactError, match="no section named 'param/model/w9'"):
        reader.section_view("param/model/w9")
    view = reader.section_view(W0)
    reader.close()  # views still held keep the map alive
    assert bytes(view[:4]) == W0_DATA.tobytes()[:4]
    with pytest.raises(ArtifactError, match="the reader is closed"):
        reader.section_view(W0)
    reader.close()  # closing twice is harmless


# --- writer failures -----------------------------------------------------------------------------


def test_invalid_manifest_writes_nothing(tmp_path):
    manifest = demo_manifest()
    manifest["parameters"][0]["length"] = 4096  # larger than the 512-byte section
    with pytest.raises(ArtifactError, match=r"cannot write: manifest field parameters\[0\]"):
        build(tmp_path / "demo.mln", manifest)
    assert list(tmp_path.iterdir()) == []


def test_failure_while_streaming_removes_temp_and_keeps_old_file(tmp_path):
    source = tmp_path / "w0.bin"
    source.write_bytes(W0_DATA.tobytes())
    target = tmp_path / "demo.mln"
    target.write_bytes(b"previous artifact")
    writer = MlnWriter(demo_manifest())
    writer.add_section(MODULE, "module", MODULE_DATA)
    writer.add_section(W0, "parameter", source)
    writer.add_section(B0, "parameter", B0_DATA)
    source.write_bytes(W0_DATA.tobytes()[:100])  # shrinks after it was added
    with pytest.raises(ArtifactError, match="changed size while being written"):
        writer.write(target)
    source.unlink()
    with pytest.raises(ArtifactError, match="cannot write"):
        writer.write(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.mln"]
    assert target.read_bytes() == b"previous artifact"


def test_unserializable_manifest_writes_nothing(tmp_path):
    manifest = demo_manifest()
    manifest["provenance"]["when"] = object()
    with pytest.raises(ArtifactError, match="manifest is not JSON"):
        build(tmp_path / "demo.mln", manifest)
    assert list(tmp_path.iterdir()) == []


def test_writer_rejects_misuse():
    with pytest.raises(ValueError, match="writer fills them"):
        MlnWriter({**demo_manifest(), "sections": []})
    writer = MlnWriter(demo_manifest())
    writer.add_section(MODULE, "module", b"x")
    with pytest.raises(ValueError, match="already added"):
        writer.add_section(MODULE, "module", b"y")
    with pytest.raises(ValueError, match="unknown section kind 'weights'"):
        writer.add_section("w", "weights", b"y")
    with pytest.raises(TypeError, match=r"pass a pathlib\.Path"):
        writer.add_section("b", "blob", "weights.bin")
    with pytest.raises(TypeError, match="bytes-like"):
        writer.add_section("b", "blob", 42)
