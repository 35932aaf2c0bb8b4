"""The runtime's entry object: one IREE VM instance and the devices of this machine."""

from __future__ import annotations

import os

import iree.runtime as rt

from myelin.mln import KeySource, load_public_key
from myelin.runtime.devices import DEFAULT_CUDA_ALLOCATOR, DeviceRegistry
from myelin.runtime.model import FROM_ARTIFACT, Model


class Instance:
    """`myelin.Instance().load("app.mln")` is the whole happy path.

    HAL devices are per process, shared by every Instance (myelin.runtime.devices), so creating
    an Instance per request costs no device; what the Instance's `device_registry` reports
    (failed drivers, moves made) is its own.

    `trust` (a public key: the path of a PEM file, PEM bytes, or an Ed25519PublicKey) is a trust
    policy: every load then hashes the whole file and refuses it, with SignatureError, unless it
    carries a valid signature by that key (`plex sign`), before any of its modules is wrapped or
    any parameter registered. Without `trust` (the default) signatures are not looked at.

    `allow_native_code=True` lets a file that is not signed by the trusted key load an external
    backend's plugin (a shared object whose code runs in this process as it loads, before any
    call); without it, and without `trust`, such a variant is refused with NativeCodeRefused.
    A file signed by the trusted key needs no opt-in. Variants without backends never need it.

    `cuda_allocator` says how CUDA devices allocate call results and transients: "pool"
    (IREE's default stream-ordered pools), "caching" (IREE's caching allocator: a steady
    stream of calls reuses its buffers instead of allocating and freeing them) or
    "caching:<capacity>[;<free count>]" (the same, holding at most <capacity> bytes, e.g.
    "caching:8G"; the default is `DEFAULT_CUDA_ALLOCATOR`, "caching:4G;64"); docs/runtime.md
    has the measurements. It is fixed per process when the CUDA driver starts.
    """

    def __init__(
        self,
        *,
        trust: KeySource | None = None,
        allow_native_code: bool = False,
        cuda_allocator: str = DEFAULT_CUDA_ALLOCATOR,
    ) -> None:
        # Load the key now: a bad key path fails here, not at the first load.
        self.trust = load_public_key(trust) if trust is not None else None
        self.allow_native_code = allow_native_code
        self.vm_instance = rt.VmInstance()
        self.device_registry = DeviceRegistry(cuda_allocator=cuda_allocator)

    def load(
        self,
        path: str | os.PathLike,
        *,
        variant: str | None = None,
        verify: bool = True,
        memory_budget: int | str | None = FROM_ARTIFACT,
        residency: str | None = None,
        lock_weights: bool = False,
        private_copy: bool | None = None,
    ) -> Model:
        """Map and validate a .mln, pick the variant (the named one, or the first whose devices
        exist here), and register its parameters zero-copy.

        The artifact's policies apply unless overridden: `memory_budget` (bytes, a size such as
        "512MiB", or None for no budget), `residency` ("resident", "streamed", "prefetch"), and
        `lock_weights` (mlock resident weights where the system allows it). Under the
        instance's trust policy `verify=False` is ignored: a signature means something only
        over bytes that match their hashes.

        `private_copy` (default: on under a trust policy, off without) copies the whole file
        into sealed memory before it is hashed, so later writes to the file (or truncating it)
        change nothing the model reads; off, the weights are the file's own pages (no copy,
        no extra memory) and change with the file. Module and plugin bytes are always hashed
        and run from a private copy. docs/security.md has the costs.
        """
        return Model(
            self.vm_instance,
            self.device_registry,
            path,
            variant=variant,
            verify=verify,
            memory_budget=memory_budget,
            residency=residency,
            lock_weights=lock_weights,
            trust=self.trust,
            private_copy=private_copy,
            allow_native_code=self.allow_native_code,
        )

    def drivers(self) -> list[str]:
        """Drivers that can create a device on this machine."""
        return self.device_registry.usable_drivers()
