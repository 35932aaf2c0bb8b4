"""The .mln container: one file holding a manifest, VM modules and parameters.

Shared by the build (which writes it) and the runtime (which maps it). It uses only the standard
library and numpy, so it imports on a device that has nothing but the IREE runtime. The format is
described in docs/mln-format.md.
"""

from myelin.mln._layout import (
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
from myelin.mln._reader import MlnReader
from myelin.mln._writer import MlnWriter

__all__ = [
    "FORMAT_MAJOR",
    "FORMAT_MINOR",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_MANIFEST_SIZE",
    "SECTION_ALIGNMENT",
    "MlnReader",
    "MlnWriter",
    "SectionEntry",
    "module_section_name",
    "parameter_section_name",
]
