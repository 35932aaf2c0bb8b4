"""The transient memory of a storage twin's call, kept by the session and reused across calls.

Why: without it, every call of an IREE function takes its intermediates with
`hal.device.queue.alloca` and gives them back with a `queue.dealloca` that waits on the host for
the call's work (docs/runtime.md, "Overhead"). A twin (myelin.compiler.storage_twins) takes that
memory as its last argument instead, and IREE compiles a function that says how much it needs
for given inputs (named in the twin's `iree.abi.transients.size` reflection, with the value
itself in `...size.constant` when no input changes it). IREE does not check the buffer's size
against that need (a short buffer is written out of bounds), so the size always comes from that
function: once per input-shape key, remembered in the twin's memo (myelin.runtime.sinks).

One buffer per entrypoint and session: calls of one session are serialized, and async calls are
ordered on the session's timeline, so a call never runs while the previous one still uses it.
A buffer that must grow is replaced; the old one lives until the calls that hold it let go.

Under a memory budget the buffer is counted for as long as the session holds it, not only while
a call runs: its bytes are reserved before it is allocated (a buffer that cannot fit is refused
like a call that cannot), and given back when it is replaced or the session closes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import iree.runtime as rt

from myelin.runtime.admission import Reservation

# Reflection keys IREE 3.13 sets on a function with external transients.
SIZE_FUNCTION = "iree.abi.transients.size"
SIZE_CONSTANT = "iree.abi.transients.size.constant"
# A buffer is never empty: IREE's CUDA allocator refuses a zero-byte allocation.
_MIN_BYTES = 256
_USAGE = int(rt.BufferUsage.TRANSFER | rt.BufferUsage.DISPATCH_STORAGE)
_MEMORY = int(rt.MemoryType.DEVICE_LOCAL)


def takes_transients(function: Any) -> bool:
    """Whether a compiled twin takes its transient memory from the caller."""
    return SIZE_FUNCTION in function.reflection


class TransientMemory:
    """The transient buffer of one entrypoint's twin on one device, for one session."""

    def __init__(self, module: Any, twin: Any, device: rt.HalDevice) -> None:
        reflection = twin.reflection
        self._size_function = module.lookup_function(reflection[SIZE_FUNCTION])
        constant = reflection.get(SIZE_CONSTANT)
        self._constant = int(constant) if constant is not None else None
        self.device = device
        self._buffer: Any = None
        self._held: Reservation | None = None  # its bytes under a memory budget

    @property
    def nbytes(self) -> int:
        """The size of the buffer the session holds now (0 before the first call)."""
        return self._buffer.byte_length() if self._buffer is not None else 0

    def size(self, query: Any, hold: Callable[[int], Reservation] | None = None) -> int:
        """The bytes a call needs: the constant, or what `query(function, buffer)` returns,
        which runs the size function on the call's own arguments (with `buffer` in the
        transients' place)."""
        if self._constant is not None:
            return self._constant
        return int(query(self._size_function, self.buffer(0, hold)))

    def buffer(self, nbytes: int, hold: Callable[[int], Reservation] | None = None) -> Any:
        """A buffer of at least `nbytes`: the one held, or a larger one that replaces it.
        `hold(n)` reserves the n bytes of a new buffer against a memory budget (it raises
        when they cannot fit); the replaced buffer's reservation is given back."""
        if self._buffer is None or self._buffer.byte_length() < nbytes:
            size = max(nbytes, _MIN_BYTES)
            held = hold(size) if hold is not None else None
            try:
                buffer = self.device.allocator.allocate_buffer(_MEMORY, _USAGE, size)
            except BaseException:
                if held is not None:
                    held.release()
                raise
            if self._held is not None:
                self._held.release()
            self._buffer, self._held = buffer, held
        return self._buffer

    def let_go(self) -> tuple[Any, Reservation | None]:
        """Forget the buffer (the session closes): it and its reservation, for the caller to
        release once the device's last call that may use it is done."""
        buffer, held = self._buffer, self._held
        self._buffer = self._held = None
        return buffer, held
