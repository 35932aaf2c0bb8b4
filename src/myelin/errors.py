"""Error types of the MyeLiN runtime.

Every error a user can cause (a corrupt artifact, a wrong input, a missing device) is one of these,
with a message that names the problem and the fix. IREE's own errors are translated at the
boundary so a user never has to read a traceback from deep inside the runtime.
"""

from __future__ import annotations


class MyelinError(Exception):
    """Base of every error the MyeLiN layer raises on purpose."""


class ArtifactError(MyelinError):
    """The .mln file is unreadable, truncated, corrupt or of an unsupported version."""


class SignatureError(ArtifactError):
    """A trust policy is set and the artifact is unsigned, signed by another key, or changed
    after it was signed. Raised before any of its code is loaded."""


class NativeCodeRefused(ArtifactError):
    """The chosen variant carries native code the dynamic loader would run in this process (an
    external backend's plugin), and the file is neither signed by the trusted key nor loaded
    with `allow_native_code=True` / `--allow-native-code`. Raised before any of it is loaded."""


class SigningKeyError(MyelinError):
    """A signing or trust key cannot be read (not a PEM ed25519 key, or `cryptography` is
    missing)."""


class ModelClosed(MyelinError):
    """The model was closed (`Model.close()`); load the file again to use it."""


class InputError(MyelinError, ValueError):
    """A call's inputs do not match the entrypoint's signature."""


class DeviceUnavailable(MyelinError):
    """No variant of the artifact can run on the devices this machine has."""


class EntrypointNotFound(MyelinError, KeyError):
    """The artifact has no entrypoint of that name."""

    def __str__(self) -> str:  # KeyError would print the message quoted
        return str(self.args[0]) if self.args else ""


class CompileError(MyelinError):
    """The IREE compiler rejected a module; the message carries its diagnostics."""


class MemoryBudgetExceeded(MyelinError):
    """A call (or a model's parameters) needs more memory than the variant's budget allows.

    Raised before anything is allocated, so a budget is never enforced by an out-of-memory crash.
    """


class MemoryNeedUnknown(MyelinError):
    """A memory budget is set but the artifact cannot say what this call needs."""


class Cancelled(MyelinError):
    """The call was cancelled (`Session.cancel()`) before it finished; the session stays usable."""


class DeadlineExceeded(Cancelled):
    """The call's `timeout=` ran out before it finished; the session stays usable."""


class ProfilingUnavailable(MyelinError):
    """This runtime or driver cannot record the profile that was asked for."""
