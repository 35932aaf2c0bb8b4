"""Native code in a .mln (an external backend's plugin: a shared object whose constructor runs
as the dynamic loader maps it) never runs unless the caller asked for it: only the chosen
variant's plugins load, after the variant is chosen, and only from a file signed by the trusted
key or with `allow_native_code=True` / `--allow-native-code`; a plugin whose bytes are not the
ones the manifest hashes is never loaded, with `verify=False` too.

The plugin here is a shared object whose constructor writes a marker file: if the marker
exists, the file's native code ran."""

from __future__ import annotations

from pathlib import Path

import pytest

import myelin
from myelin.errors import ArtifactError, NativeCodeRefused
from myelin.mln import generate_key_pair, sign_file
from tests.security.crafting import PLUGIN_SECTION, marker_plugin, plex, with_plugin_variant

RUN = ("-f", "forward", "--input", "2x16xf32=1")


@pytest.fixture
def marker(tmp_path) -> Path:
    return tmp_path / "native-code-ran"


@pytest.fixture
def plugin(tmp_path, marker) -> bytes:
    return marker_plugin(tmp_path, marker)


@pytest.fixture
def native_first(mlp_mln, plugin, tmp_path) -> Path:
    """The MLP with a variant "native" listed first: the variant a plain load picks."""
    return with_plugin_variant(mlp_mln, tmp_path / "native-first.mln", plugin)


def test_a_plugin_is_refused_unless_asked_for(native_first, marker):
    with pytest.raises(NativeCodeRefused, match="variant 'native' carries native code") as e:
        myelin.Instance().load(native_first)
    assert "--allow-native-code" in str(e.value) and "trust" in str(e.value)  # names the fix
    assert not marker.exists()


@pytest.mark.parametrize(
    "verb", [("run", *RUN), ("bench", "-f", "forward", "-n", "1", "--warmup", "0"),
             ("profile", "-f", "forward", "--dim", "*=2", "-o", "prof")]
)  # fmt: skip
def test_plex_verbs_refuse_a_plugin_unless_asked_for(verb, native_first, marker, tmp_path):
    name, *rest = verb
    rest = [str(tmp_path / a) if a == "prof" else a for a in rest]
    done = plex(name, native_first, *rest)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "error:" in done.stderr and "--allow-native-code" in done.stderr
    assert "Traceback" not in done.stderr
    assert not marker.exists()


def test_only_the_chosen_variant_loads_its_plugin(native_first, marker):
    done = plex("run", native_first, *RUN, "--variant", "default")
    assert done.returncode == 0, done.stderr
    assert "result 0:" in done.stdout
    assert not marker.exists()


def test_a_variant_that_cannot_run_here_never_loads_its_plugin(mlp_mln, plugin, marker, tmp_path):
    path = with_plugin_variant(mlp_mln, tmp_path / "elsewhere.mln", plugin, runs_here=False)
    with myelin.Instance().load(path) as model:
        assert model.variant_name == "default"
    assert not marker.exists()


def test_a_plugin_loads_when_asked_for(native_first, marker):
    """The opt-in works (and the marker shows a loaded plugin): the constructor runs, then the
    plugin is refused for want of the backend ABI."""
    done = plex("run", native_first, *RUN, "--allow-native-code")
    assert done.returncode == 1 and "its plugin does not load here" in done.stderr, done.stderr
    assert marker.exists()


def test_a_plugin_signed_by_the_trusted_key_needs_no_opt_in(native_first, marker, tmp_path):
    private, public = generate_key_pair()
    (tmp_path / "k.pem").write_bytes(private)
    (tmp_path / "k.pub.pem").write_bytes(public)
    sign_file(native_first, tmp_path / "k.pem")
    done = plex("run", native_first, *RUN, "--trust", tmp_path / "k.pub.pem")
    assert "its plugin does not load here" in done.stderr, done.stderr
    assert marker.exists()


def test_an_unhashed_plugin_is_never_loaded(native_first, marker, tmp_path):
    """verify=False skips the weights' hashes, never the plugin's: a plugin changed after the
    build (hash not recomputed) is refused before the dynamic loader sees it, even opted in."""
    from myelin.mln import MlnReader

    with MlnReader(native_first) as reader:
        section = reader.sections[PLUGIN_SECTION]
    data = bytearray(native_first.read_bytes())
    data[section.offset + section.length - 1] ^= 0xFF  # the ELF's last byte
    native_first.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=f"section '{PLUGIN_SECTION}' is corrupt"):
        myelin.Instance(allow_native_code=True).load(native_first, verify=False)
    assert not marker.exists()


def test_an_empty_plugin_is_refused_with_a_typed_error(mlp_mln, tmp_path):
    path = with_plugin_variant(mlp_mln, tmp_path / "empty.mln", b"")
    with pytest.raises(myelin.DeviceUnavailable, match="backend 'evil'"):
        myelin.Instance(allow_native_code=True).load(path)
