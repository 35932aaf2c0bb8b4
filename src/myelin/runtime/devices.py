"""Finding the HAL devices a variant needs on this machine."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import iree.runtime as rt

from myelin import hostinfo
from myelin.errors import DeviceUnavailable


@dataclass(frozen=True)
class DeviceRequirement:
    """One device of a variant, as recorded in the .mln manifest."""

    name: str
    target: str
    driver: str
    cpu_flags: frozenset[str] = frozenset()


class DeviceRegistry:
    """Creates HAL devices on demand and remembers which drivers failed (and why).

    Devices are created per (driver, ordinal): a variant with two local-task devices gets two
    distinct devices, and models loaded on the same driver share them.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._drivers: dict[str, rt.HalDriver] = {}
        self._devices: dict[tuple[str, int], rt.HalDevice] = {}
        self._failures: dict[str, str] = {}

    def compiled_drivers(self) -> list[str]:
        return sorted(rt.query_available_drivers())

    def _driver(self, name: str) -> rt.HalDriver:
        with self._lock:
            if name in self._drivers:
                return self._drivers[name]
            if name in self._failures:
                raise DeviceUnavailable(self._failures[name])
            if name not in rt.query_available_drivers():
                reason = (
                    f"driver '{name}' is not part of this IREE runtime "
                    f"(it has: {', '.join(self.compiled_drivers())})"
                )
                self._failures[name] = reason
                raise DeviceUnavailable(reason)
            try:
                driver = rt.get_driver(name)
            except Exception as e:  # IREE reports a missing libcuda etc. as a RuntimeError
                reason = f"driver '{name}' cannot start here: {_first_line(e)}"
                self._failures[name] = reason
                raise DeviceUnavailable(reason) from e
            self._drivers[name] = driver
            return driver

    def device(self, driver: str, ordinal: int = 0) -> rt.HalDevice:
        key = (driver, ordinal)
        with self._lock:
            if key in self._devices:
                return self._devices[key]
        drv = self._driver(driver)
        try:
            dev = drv.create_default_device()  # each call creates a distinct device
        except Exception as e:
            reason = f"driver '{driver}' has no usable device: {_first_line(e)}"
            with self._lock:
                self._failures[driver] = reason
            raise DeviceUnavailable(reason) from e
        with self._lock:
            return self._devices.setdefault(key, dev)

    def why_unusable(self, requirement: DeviceRequirement) -> str | None:
        """None when the device can be used here, else a reason for people."""
        missing = requirement.cpu_flags - hostinfo.cpu_flags()
        if missing and hostinfo.cpu_flags():
            return (
                f"device '{requirement.name}' was compiled for CPU features this CPU lacks "
                f"({', '.join(sorted(missing))}); rebuild with cpu = \"generic\" or for this CPU"
            )
        try:
            self._driver(requirement.driver)
        except DeviceUnavailable as e:
            return f"device '{requirement.name}': {e}"
        return None

    def usable_drivers(self) -> list[str]:
        usable = []
        for name in self.compiled_drivers():
            try:
                self._driver(name)
                usable.append(name)
            except DeviceUnavailable:
                pass
        return usable


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
