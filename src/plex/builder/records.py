"""Records: the files each build step writes into its node's output folder, and their readers.

Steps write them, the link step and compose read them; one definition of every file name.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from myelin.codecs import NO_CODEC
from myelin.dtypes import itemsize
from plex.errors import BuildError
from synapse import file_digest

IMPORTED_MODULE = "module.mlirbc"
IMPORT_META = "import.json"
EXPORTED_DIR = "exported"
WEIGHTS_INDEX = "weights.json"
WEIGHTS_DIR = "tensors"
COMPILED_MODULE = "module.vmfb"
COMPILE_META = "compile.json"
PHASES_DIR = "phases"


def source_digest(path: Path) -> str:
    """The digest a phase file and the provenance record of a graph source."""
    return file_digest(path)


def read_import_meta(out_dir: Path) -> dict:
    return json.loads((out_dir / IMPORT_META).read_text())


def read_compile_meta(out_dir: Path) -> dict:
    return json.loads((out_dir / COMPILE_META).read_text())


def read_weights_index(out_dir: Path) -> list[dict]:
    return json.loads((out_dir / WEIGHTS_INDEX).read_text())


# safetensors dtype -> numpy dtype name (the names myelin.dtypes uses)
SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "U8": "uint8",
    "BOOL": "bool",
}


def read_safetensors_header(source: Path, *, what: str) -> list[dict]:
    """The tensors of a safetensors file, sorted by key: key, dtype, shape and the absolute byte
    range [begin, end), every range checked against the header and the file size."""
    try:
        size = source.stat().st_size
        with source.open("rb") as f:
            length = int.from_bytes(f.read(8), "little")
            if not 2 <= length <= size - 8:
                raise ValueError(f"header length {length} does not fit a {size}-byte file")
            header = json.loads(f.read(length))
    except (OSError, ValueError) as e:
        raise BuildError(f"weights {what}: cannot read {source.name}: {e}") from e
    if not isinstance(header, dict):
        raise BuildError(f"weights {what}: {source.name} has no tensor table")
    tensors = []
    for key, entry in sorted(header.items()):
        if key == "__metadata__":
            continue
        if isinstance(entry, dict) and entry.get("dtype") not in SAFETENSORS_DTYPES:
            raise BuildError(
                f"weights {what}: {source.name}: tensor '{key}' has dtype {entry.get('dtype')!r}, "
                f"which PLeX does not read (accepted: {', '.join(SAFETENSORS_DTYPES)})"
            )
        try:
            dtype = SAFETENSORS_DTYPES[entry["dtype"]]
            shape = [int(d) for d in entry["shape"]]
            begin, end = (8 + length + int(o) for o in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as e:
            raise BuildError(
                f"weights {what}: {source.name}: tensor '{key}' has an unreadable entry: {e!r}"
            ) from e
        expected = itemsize(dtype) * math.prod(shape)
        if end - begin != expected or begin < 8 + length or end > size:
            raise BuildError(
                f"weights {what}: {source.name}: tensor '{key}' ({entry['dtype']}{shape}) "
                f"claims bytes [{begin}, {end}) of a {size}-byte file; the file is corrupt"
            )
        tensors.append({"key": key, "dtype": dtype, "shape": shape, "begin": begin, "end": end})
    return tensors


def codec_parts(meta: dict) -> dict[tuple[str, str], dict]:
    """(scope, stored key) -> {"record": parameter record, "part": part or None} of an encode
    node's meta; `part` is None for a parameter kept as it was (the record says why)."""
    parts: dict[tuple[str, str], dict] = {}
    for record in meta.get("codecs", []):
        if record["codec"] == NO_CODEC:
            parts[(record["scope"], record["key"])] = {"record": record, "part": None}
            continue
        for part in record["parts"]:
            parts[(record["scope"], part["key"])] = {"record": record, "part": part}
    return parts
