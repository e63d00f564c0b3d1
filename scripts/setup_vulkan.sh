#!/usr/bin/env bash
# What `make test-vulkan` needs on Debian 12 (these machines): a real Vulkan device without a GPU (Mesa's lavapipe),
# glslc, and the Vulkan build of llama-server from the pinned source.
#
# Debian 12's Vulkan headers (1.3.239) are too old for the pinned llama.cpp, which uses VK_EXT_layer_settings
# (vk::LayerSettingEXT) unguarded. Debian 13's libvulkan-dev (Vulkan-Headers 1.4.309) has it: its .deb is fetched
# from Debian's archive with a private apt list (nothing is installed from it), checked against a pinned sha256 and
# unpacked into the cache dir, and the build is pointed at its headers. No llama.cpp file is patched.
set -euo pipefail

PY="${PY:-.venv/bin/python}"
CACHE="${GGUF_PROVIDER_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/gguf-provider}"
HDR="$CACHE/vulkan-headers/1.4.309.0-1"
DEB=libvulkan-dev_1.4.309.0-1_amd64.deb
DEB_SHA256=8d329d465e16168afff58b1bd0dd6db46aac2cc3f56054a481b25a04e90b345a
LIBVULKAN=/usr/lib/x86_64-linux-gnu/libvulkan.so.1

if [ "$(uname -m)" != x86_64 ] || [ ! -r /etc/debian_version ]; then
  echo "setup_vulkan.sh: written for Debian on x86_64 (the pinned .deb); elsewhere install the Vulkan SDK and run" \
       "gguf-provider server install --backend vulkan --from source" >&2
  exit 2
fi

# 1. lavapipe, the loader, glslc and the SPIR-V headers from the machine's own Debian release.
missing=()
for pkg in glslc libvulkan1 mesa-vulkan-drivers spirv-headers; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup_vulkan.sh: installing ${missing[*]}"
  $sudo apt-get update -q
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# 2. Vulkan headers new enough, unpacked (not installed) from Debian 13's libvulkan-dev.
if [ ! -f "$HDR/usr/include/vulkan/vulkan.hpp" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
    > "$tmp/sources.list"
  apt=(apt-get -q -o "Dir::Etc::SourceList=$tmp/sources.list" -o Dir::Etc::SourceParts=/dev/null
       -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o APT::Sandbox::User=root)
  "${apt[@]}" update
  (cd "$tmp" && "${apt[@]}" download libvulkan-dev=1.4.309.0-1)
  echo "$DEB_SHA256  $tmp/$DEB" | sha256sum -c -
  rm -rf "$HDR.partial" && mkdir -p "$HDR.partial"
  dpkg-deb -x "$tmp/$DEB" "$HDR.partial"
  mv "$HDR.partial" "$HDR"
fi

# 3. The Vulkan build (an incremental no-op when it is there already).
"$PY" -m gguf_provider.cli server install --backend vulkan --from source \
  --cmake-arg="-DVulkan_INCLUDE_DIR=$HDR/usr/include" --cmake-arg="-DVulkan_LIBRARY=$LIBVULKAN"

# 4. The Vulkan build is for tests/vulkan_tests (which name it): `server install` without --backend leaves discovery
#    with the machine's own choice (a named backend would otherwise be used from now on).
"$PY" -m gguf_provider.cli server install
