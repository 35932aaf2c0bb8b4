#!/usr/bin/env bash
# Make sure this machine has a Vulkan device for the Vulkan tests (tests/myelin/test_vulkan.py).
#
# Does nothing when a Vulkan device already exists (a GPU's driver, or a software device). Else,
# on Debian or Ubuntu, installs Mesa's software Vulkan device, lavapipe (packages
# mesa-vulkan-drivers, libvulkan1, vulkan-tools), as root or through passwordless sudo. Elsewhere
# it says what is missing and exits 0: the Vulkan tests then skip, naming the reason. Prints one
# line saying what it did; apt's output goes to a log in $TMPDIR.
set -uo pipefail

PACKAGES=(mesa-vulkan-drivers libvulkan1 vulkan-tools)

vulkan_device() {
    # The name of the first Vulkan device, empty when there is none.
    if command -v vulkaninfo >/dev/null 2>&1; then
        vulkaninfo --summary 2>/dev/null | sed -n 's/^[[:space:]]*deviceName[[:space:]]*= //p' | head -n 1
        return
    fi
    # No vulkaninfo: a loader and an installed driver manifest (ICD) are taken as a device.
    if ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1'; then
        for dir in /usr/share/vulkan/icd.d /etc/vulkan/icd.d /usr/local/share/vulkan/icd.d; do
            for icd in "$dir"/*.json; do
                [ -e "$icd" ] && { basename "$icd" .json; return; }
            done
        done
        [ -n "${VK_DRIVER_FILES:-}${VK_ICD_FILENAMES:-}" ] && echo "${VK_DRIVER_FILES:-$VK_ICD_FILENAMES}"
    fi
}

found="$(vulkan_device)"
if [ -n "$found" ]; then
    echo "install_vulkan: a Vulkan device exists ($found); nothing installed"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_vulkan: no Vulkan device and no apt-get; install a Vulkan driver (Mesa's lavapipe, or your GPU's) and the Vulkan loader (see docs/platforms.md); the Vulkan tests will skip"
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    echo "install_vulkan: no Vulkan device; as root run: apt-get install -y ${PACKAGES[*]} (the Vulkan tests will skip)"
    exit 0
fi

log="${TMPDIR:-/tmp}/install_vulkan.log"
export DEBIAN_FRONTEND=noninteractive
install() { "${as_root[@]}" apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >>"$log" 2>&1; }
# A fresh container has no package lists yet: update only when the install needs it.
if ! install && ! { "${as_root[@]}" apt-get update -q >>"$log" 2>&1 && install; }; then
    echo "install_vulkan: apt-get could not install ${PACKAGES[*]} (log: $log); the Vulkan tests will skip"
    exit 0
fi
found="$(vulkan_device)"
echo "install_vulkan: installed ${PACKAGES[*]}; Vulkan device: ${found:-none found (log: $log)}"
