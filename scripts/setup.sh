#!/usr/bin/env bash
# Installs every build, test and benchmark dependency of strata from Debian's packages.
# Idempotent: when everything is already installed it prints one line and changes nothing.
set -euo pipefail

packages=(
  build-essential pkg-config meson ninja-build
  liburing-dev libaio-dev libtbb-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libyaml-cpp-dev libcli11-dev libxxhash-dev
  nlohmann-json3-dev libopenblas-dev libcpp-httplib-dev
  fio python3 python3-torch python3-numpy
  prometheus chromium chromium-driver python3-selenium
  # clang for the ASan + fuzz build; its sanitizer and libFuzzer runtimes are a package apart
  # (libclang-rt-14-dev), which a plain Debian 12 lacks.
  clang libfuzzer-14-dev libclang-rt-14-dev
  # A compiler cache: a cold run is what CI's budget is set for, but a machine that built
  # strata before (a developer's, or CI right after a session on the same machine) builds in
  # minutes. scripts/test.sh makes hits work from any checkout folder.
  ccache
  libpcre2-dev libsentencepiece-dev libutf8proc-dev python3-sentencepiece nodejs
  openmpi-bin libopenmpi-dev
  patchelf debootstrap  # scripts/gpu-bundle.sh (rpath), scripts/gpu-bundle-check.sh (a bare chroot)
  python3-jinja2  # the reference chat-template renderer (tests/data/test_chat_templates.py)
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$package")
  fi
done

# The tokenizer tests' JavaScript references (tests only, docs/tokenizers.md), pinned by
# tests/tokenizer/js/package-lock.json; npm ships with NodeSource's nodejs, apart in Debian's.
js_references() {
  local folder
  folder="$(dirname "$0")/../tests/tokenizer/js"
  if [ ! -d "$folder/node_modules/@huggingface/tokenizers" ] || [ ! -d "$folder/node_modules/js-tiktoken" ]; then
    echo "setup: installing the tokenizer tests' npm packages in tests/tokenizer/js"
    npm ci --prefix "$folder" --no-audit --no-fund --loglevel=error
  fi
}

if [ ${#missing[@]} -eq 0 ] && command -v npm >/dev/null; then
  js_references
  echo "setup: all ${#packages[@]} dependencies present"
  exit 0
fi

echo "setup: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
if ! command -v npm >/dev/null; then missing+=(npm); fi
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
js_references
