"""The manifest's schema, checked field by field, and its one JSON encoding.

One validator serves both sides: the writer runs it on the manifest it is about to write and the
reader on the manifest it has just read, so the writer cannot produce a file the reader rejects.
Every field the reader or the runtime relies on must be present with the right type; extra keys
are allowed anywhere, because a newer minor version adds fields.
"""

from __future__ import annotations

import json
import re
from typing import Any

from myelin.mln._layout import FORMAT_MINOR, MIN_ALIGNMENT, SECTION_ALIGNMENT, SectionEntry

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class ManifestInvalid(ValueError):
    """A manifest breaks the schema; `field` is the path of the offending field."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"manifest field {field}: {problem}" if field else f"manifest {problem}")
        self.field = field


# --- encoding ------------------------------------------------------------------------------------


def encode_manifest(manifest: dict[str, Any]) -> bytes:
    """The canonical bytes: UTF-8 JSON, sorted keys, compact separators (deterministic)."""
    text = json.dumps(
        manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return text.encode("utf-8")


def decode_manifest(data: bytes) -> Any:
    """Parse manifest bytes; raises UnicodeDecodeError, ValueError or RecursionError."""
    return json.loads(
        data.decode("utf-8"),
        object_pairs_hook=_object_without_duplicate_keys,
        parse_constant=_reject_constant,
    )


def _object_without_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:  # JSON leaves duplicates undefined; the writer never makes them
            raise ValueError(f"duplicate key {key!r} in a JSON object")
        result[key] = value
    return result


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# --- field checks --------------------------------------------------------------------------------


def _show(value: Any) -> str:
    text = "null" if value is None else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _field(obj: dict[str, Any], key: str, where: str) -> tuple[Any, str]:
    path = f"{where}.{key}" if where else key
    if key not in obj:
        raise ManifestInvalid(path, "is missing")
    return obj[key], path


def _dict(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ManifestInvalid(where, f"must be an object, got {_show(value)}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ManifestInvalid(where, f"must be a list, got {_show(value)}")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ManifestInvalid(where, f"must be a non-empty string, got {_show(value)}")
    return value


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _int(value: Any, where: str) -> int:
    if not _is_count(value):
        raise ManifestInvalid(where, f"must be an integer >= 0, got {_show(value)}")
    return value


def _str_list(value: Any, where: str) -> list[str]:
    return [_str(item, f"{where}[{i}]") for i, item in enumerate(_list(value, where))]


def _objects(obj: dict[str, Any], key: str, where: str):
    """Yield (path, object) for each item of the list obj[key]."""
    items, path = _field(obj, key, where)
    for i, item in enumerate(_list(items, path)):
        yield f"{path}[{i}]", _dict(item, f"{path}[{i}]")


def _required_str(obj: dict[str, Any], key: str, where: str) -> str:
    return _str(*_field(obj, key, where))


def _required_int(obj: dict[str, Any], key: str, where: str) -> int:
    return _int(*_field(obj, key, where))


def _optional(obj: dict[str, Any], key: str, where: str, check) -> Any:
    return check(obj[key], f"{where}.{key}") if key in obj else None


def _unique(name: str, seen: set, where: str, what: str) -> None:
    if name in seen:
        raise ManifestInvalid(where, f"duplicate {what} {_show(name)}")
    seen.add(name)


# --- the schema ----------------------------------------------------------------------------------


def validate_manifest(manifest: Any, *, format_version: tuple[int, int]) -> dict[str, SectionEntry]:
    """Check a manifest against the schema; return its section table by name.

    `format_version` is the header's; the manifest's "format" must agree with it. Raises
    ManifestInvalid naming the first bad field.
    """
    m = _dict(manifest, "")
    fmt = _dict(*_field(m, "format", ""))
    version = (_required_int(fmt, "major", "format"), _required_int(fmt, "minor", "format"))
    if version != format_version:
        raise ManifestInvalid(
            "format",
            f"says {version[0]}.{version[1]} but the header says "
            f"{format_version[0]}.{format_version[1]}",
        )
    app = _dict(*_field(m, "app", ""))
    _required_str(app, "name", "app")
    _required_str(app, "version", "app")

    sections = _check_sections(m, newer_minor=version[1] > FORMAT_MINOR)
    _check_parameters(m, sections)
    _check_variants(m, sections)

    tuning, path = _field(m, "tuning", "")
    if tuning is not None:
        _dict(tuning, path)
    provenance = _dict(*_field(m, "provenance", ""))
    for key in ("plex_version", "iree_compiler_version"):
        _optional(provenance, key, "provenance", _str)
    sources = _optional(provenance, "sources", "provenance", _dict) or {}
    for name, digest in sources.items():
        _str(digest, f"provenance.sources[{name!r}]")
    return sections


def _check_sections(m: dict[str, Any], *, newer_minor: bool) -> dict[str, SectionEntry]:
    sections: dict[str, SectionEntry] = {}
    for where, s in _objects(m, "sections", ""):
        name = _required_str(s, "name", where)
        if name in sections:
            raise ManifestInvalid(f"{where}.name", f"duplicate section name {name!r}")
        kind = _required_str(s, "kind", where)
        minimum = SECTION_ALIGNMENT.get(kind)
        if minimum is None:
            if not newer_minor:  # a newer minor may add kinds; we bounds- and hash-check them
                known = ", ".join(SECTION_ALIGNMENT)
                raise ManifestInvalid(
                    f"{where}.kind", f"unknown section kind {kind!r} (expected one of {known})"
                )
            minimum = MIN_ALIGNMENT
        offset = _required_int(s, "offset", where)
        length = _required_int(s, "length", where)
        alignment = _required_int(s, "alignment", where)
        if alignment < minimum or alignment & (alignment - 1):
            raise ManifestInvalid(
                f"{where}.alignment",
                f"must be a power of two >= {minimum} for kind {kind!r}, got {alignment}",
            )
        if offset % alignment:
            raise ManifestInvalid(
                f"{where}.offset", f"{offset} is not a multiple of the alignment {alignment}"
            )
        digest = _required_str(s, "sha256", where)
        if not _SHA256_HEX.fullmatch(digest):
            raise ManifestInvalid(
                f"{where}.sha256", f"must be 64 lowercase hex digits, got {_show(digest)}"
            )
        sections[name] = SectionEntry(name, kind, offset, length, alignment, digest)
    return sections


def _section_ref(
    obj: dict[str, Any], where: str, sections: dict[str, SectionEntry], kind: str
) -> SectionEntry:
    name = _required_str(obj, "section", where)
    section = sections.get(name)
    if section is None:
        raise ManifestInvalid(f"{where}.section", f"names no section of the file: {name!r}")
    if section.kind != kind:
        raise ManifestInvalid(
            f"{where}.section", f"section {name!r} is of kind {section.kind!r}, not {kind!r}"
        )
    return section


def _check_parameters(m: dict[str, Any], sections: dict[str, SectionEntry]) -> None:
    seen: set[tuple[str, str]] = set()
    for where, p in _objects(m, "parameters", ""):
        scope = _required_str(p, "scope", where)
        key = _required_str(p, "key", where)
        _unique((scope, key), seen, where, "parameter (scope, key)")
        section = _section_ref(p, where, sections, "parameter")
        offset = _required_int(p, "offset", where)
        length = _required_int(p, "length", where)
        if offset + length > section.length:
            raise ManifestInvalid(
                where,
                f"byte range {offset}..{offset + length} lies outside its section "
                f"{section.name!r} ({section.length} bytes)",
            )
        for key in ("codec", "dtype", "layout"):
            _required_str(p, key, where)
        shape, path = _field(p, "shape", where)
        for i, dim in enumerate(_list(shape, path)):
            _int(dim, f"{path}[{i}]")


def _check_variants(m: dict[str, Any], sections: dict[str, SectionEntry]) -> None:
    variant_names: set[str] = set()
    for where, v in _objects(m, "variants", ""):
        _unique(_required_str(v, "name", where), variant_names, f"{where}.name", "variant name")

        devices: set[str] = set()
        for dwhere, d in _objects(v, "devices", where):
            _unique(_required_str(d, "name", dwhere), devices, f"{dwhere}.name", "device name")
            _required_str(d, "target", dwhere)
            _required_str(d, "driver", dwhere)
            _optional(d, "options", dwhere, _dict)
            requires = _optional(d, "requires", dwhere, _dict)
            if requires is not None:
                _optional(requires, "cpu_flags", f"{dwhere}.requires", _str_list)

        modules: set[str] = set()
        for mwhere, mod in _objects(v, "modules", where):
            _unique(_required_str(mod, "name", mwhere), modules, f"{mwhere}.name", "module name")
            _section_ref(mod, mwhere, sections, "module")

        entrypoints: set[str] = set()
        for ewhere, e in _objects(v, "entrypoints", where):
            name = _required_str(e, "name", ewhere)
            _unique(name, entrypoints, f"{ewhere}.name", "entrypoint name")
            module = _required_str(e, "module", ewhere)
            if module not in modules:
                raise ManifestInvalid(
                    f"{ewhere}.module", f"names no module of this variant: {module!r}"
                )
            _required_str(e, "function", ewhere)
            device = _optional(e, "device", ewhere, _str)
            if device is not None and device not in devices:
                raise ManifestInvalid(
                    f"{ewhere}.device", f"names no device of this variant: {device!r}"
                )
            for key in ("inputs", "outputs"):
                for twhere, t in _objects(e, key, ewhere):
                    _check_tensor(t, twhere)

        _str_list(*_field(v, "parameter_scopes", where))
        _optional(v, "flags", where, _str_list)


def _check_tensor(t: dict[str, Any], where: str) -> None:
    """An entrypoint argument or result: a tensor, or a scalar when "shape" is null."""
    _required_str(t, "name", where)
    _required_str(t, "dtype", where)
    shape, path = _field(t, "shape", where)
    rank = 0
    if shape is not None:
        rank = len(_list(shape, path))
        for i, dim in enumerate(shape):
            if dim is not None and not _is_count(dim):
                raise ManifestInvalid(
                    f"{path}[{i}]", f"must be an integer >= 0 or null, got {_show(dim)}"
                )
    if "dims" in t:
        dims = _list(t["dims"], f"{where}.dims")
        if len(dims) != rank:
            raise ManifestInvalid(f"{where}.dims", f"has {len(dims)} entries but shape has {rank}")
        for i, dim in enumerate(dims):
            if not (_is_count(dim) or (isinstance(dim, str) and dim)):
                raise ManifestInvalid(
                    f"{where}.dims[{i}]",
                    f"must be an integer >= 0 or a dimension name, got {_show(dim)}",
                )
