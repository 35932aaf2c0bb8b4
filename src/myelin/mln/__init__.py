"""The .mln container: one file holding a manifest, VM modules and parameters.

Shared by the build (which writes it) and the runtime (which maps it). It uses only the standard
library and numpy, so it imports on a device that has nothing but the IREE runtime (signing and
trust policies import `cryptography` when they are used). The format is described in
docs/mln-format.md.
"""

from myelin.mln._layout import (
    FLAG_SIGNED,
    FORMAT_MAJOR,
    FORMAT_MINOR,
    HEADER_SIZE,
    MAGIC,
    MAX_MANIFEST_SIZE,
    SECTION_ALIGNMENT,
    SectionEntry,
    module_section_name,
    parameter_section_name,
)
from myelin.mln._manifest import ManifestInvalid
from myelin.mln._reader import MlnReader, sealed_memfd, sha256_of
from myelin.mln._records import (
    MAX_COUNT,
    MAX_RANK,
    MAX_TENSOR_BYTES,
    RESIDENCY_MODES,
    AppRecord,
    ArtifactManifest,
    BackendRecord,
    DeviceRecord,
    DeviceRequirements,
    EntrypointRecord,
    MemoryRecord,
    ModuleRecord,
    ParameterRecord,
    PoliciesRecord,
    ProfileRecord,
    ProvenanceRecord,
    ScheduleRecord,
    SizeFormula,
    StorageRecord,
    VariantRecord,
    size_formula_json,
)
from myelin.mln._signing import (
    TRAILER_SIZE,
    KeySource,
    SignatureTrailer,
    generate_key_pair,
    key_id,
    load_private_key,
    load_public_key,
)
from myelin.mln._writer import MlnWriter, sign_file

__all__ = [
    "FLAG_SIGNED",
    "FORMAT_MAJOR",
    "FORMAT_MINOR",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_COUNT",
    "MAX_MANIFEST_SIZE",
    "MAX_RANK",
    "MAX_TENSOR_BYTES",
    "RESIDENCY_MODES",
    "SECTION_ALIGNMENT",
    "TRAILER_SIZE",
    "AppRecord",
    "ArtifactManifest",
    "BackendRecord",
    "DeviceRecord",
    "DeviceRequirements",
    "EntrypointRecord",
    "KeySource",
    "ManifestInvalid",
    "MemoryRecord",
    "MlnReader",
    "MlnWriter",
    "ModuleRecord",
    "ParameterRecord",
    "PoliciesRecord",
    "ProfileRecord",
    "ProvenanceRecord",
    "ScheduleRecord",
    "SectionEntry",
    "SignatureTrailer",
    "SizeFormula",
    "StorageRecord",
    "VariantRecord",
    "generate_key_pair",
    "key_id",
    "load_private_key",
    "load_public_key",
    "module_section_name",
    "parameter_section_name",
    "sealed_memfd",
    "sha256_of",
    "sign_file",
    "size_formula_json",
]
