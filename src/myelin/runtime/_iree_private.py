"""Every private API of iree.runtime that MyeLiN relies on, behind one small shim.

The public Python API of iree-base-runtime 3.13 lacks three things the runtime needs: the native
argument packer that `FunctionInvoker` uses (built once per session instead of per call), a
device array's HAL buffer view (to move it between devices without a host round trip), and
switching off nanobind's exit-time leak report for devices kept alive on purpose. They live in
`iree.runtime._binding` and on `DeviceArray._buffer_view`; a new IREE release is checked here,
in one place.
"""

from __future__ import annotations

from typing import Any

from iree.runtime._binding import (  # the wheel is pinned: iree-base-runtime==3.13.0
    ArgumentPacker,
    InvokeContext,
    _invoke_statics,
    disable_leak_checker,
)

__all__ = [
    "InvokeContext",
    "argument_packer",
    "buffer_view_of",
    "disable_leak_checker",
    "is_device_array",
]


def argument_packer() -> Any:
    """IREE's native packer of call arguments (numpy arrays, device arrays, scalars)."""
    return ArgumentPacker(_invoke_statics, None)


def is_device_array(value: object) -> bool:
    """Whether `value` is an `iree.runtime.DeviceArray` (its data stays on its device)."""
    return hasattr(value, "_buffer_view")


def buffer_view_of(array: Any) -> Any:
    """The HAL buffer view behind a `DeviceArray`."""
    return array._buffer_view
