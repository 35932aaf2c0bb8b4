"""Every private API of iree.runtime that MyeLiN relies on, behind one small shim.

The public Python API of iree-base-runtime 3.13 lacks four things the runtime needs: the native
argument packer that `FunctionInvoker` uses (built once per session instead of per call), a
device array's HAL buffer view and device (to move it between devices without a host round trip,
and to check a device argument without reading its dtype and shape through `DeviceArray`, which
costs microseconds per input), the HAL element type of a numpy dtype, and switching off
nanobind's exit-time leak report for devices kept alive on purpose. They live in
`iree.runtime._binding`, `iree.runtime.array_interop` and on `DeviceArray._buffer_view` /
`._device`; a new IREE release is checked here, in one place. One more lives outside this shim:
`myelin.runtime.tensors.DeviceTensor` overrides `DeviceArray._copy_to_host` (IREE's read of
unmappable memory, which Vulkan refuses; myelin.runtime.host_transfer).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

import iree.runtime as rt
import numpy as np
from iree.runtime._binding import (  # the wheel is pinned: iree-base-runtime==3.13.0
    ArgumentPacker,
    InvokeContext,
    _invoke_statics,
    disable_leak_checker,
)
from iree.runtime.array_interop import map_dtype_to_element_type

__all__ = [
    "InvokeContext",
    "accepted_element_types",
    "argument_packer",
    "buffer_view_of",
    "device_of",
    "disable_leak_checker",
    "element_type_of",
    "is_device_array",
]


def argument_packer() -> Any:
    """IREE's native packer of call arguments (numpy arrays, device arrays, scalars)."""
    return ArgumentPacker(_invoke_statics, None)


def is_device_array(value: object) -> bool:
    """Whether `value` is an `iree.runtime.DeviceArray` (its data stays on its device)."""
    return hasattr(value, "_buffer_view")


# The HAL buffer view behind a `DeviceArray`, and the HAL device its buffer lives on. Attribute
# getters (C calls), not Python functions: a call's fast check reads them once per input.
buffer_view_of: Callable[[Any], Any] = attrgetter("_buffer_view")
device_of: Callable[[Any], Any] = attrgetter("_device")


def accepted_element_types(dtype: Any) -> tuple[int, ...] | None:
    """The HAL element types a buffer view may report for an input of numpy `dtype`: its own,
    and for an integer dtype the signless type of its width, which IREE gives the results of
    integer ops (a causal LM's greedy tokens, int64, come back INT_64, not SINT_64) and which
    a function reads the same. None where IREE has no element type for `dtype`."""
    own = element_type_of(dtype)
    if own is None:
        return None
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return (own, int(getattr(rt.HalElementType, f"INT_{8 * dtype.itemsize}")))
    return (own,)


def element_type_of(dtype: Any) -> int | None:
    """The HAL element type a buffer view of numpy `dtype` reports (`HalBufferView.element_type`
    is a plain int), or None when IREE has none for it."""
    element_type = map_dtype_to_element_type(dtype)
    return None if element_type is None else int(element_type)
