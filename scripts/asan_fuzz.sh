# scripts/asan_fuzz.sh — sourced by sanitize.sh and fuzz.sh: how build-asan/ is configured. One
# clang build serves both the ASan + UBSan suites and the libFuzzer harnesses: every object
# carries ASan, UBSan and libFuzzer's coverage hooks (-Dfuzz=true), so the harnesses link against
# the libraries the sanitized suites already built (before, build-fuzz/ compiled the whole
# engine a fourth time for seven small programs; README "CI time").
setup_asan_fuzz_build() {
  local seconds=${FUZZ_SECONDS:-45}
  # A build-asan/ from before this layout (gcc, no fuzz hooks) cannot link the harnesses.
  if [ -f build-asan/build.ninja ] && ! /usr/bin/python3 - <<'PY'
import json, sys
options = {o["name"]: o["value"] for o in json.load(open("build-asan/meson-info/intro-buildoptions.json"))}
sys.exit(0 if options.get("fuzz") is True else 1)
PY
  then
    echo "asan_fuzz.sh: build-asan/ predates the shared ASan + fuzz build; configuring it again"
    rm -rf build-asan
  fi
  if [ ! -f build-asan/build.ninja ]; then
    # clang: libFuzzer is clang's. Meson puts ccache in front of the compiler by itself only when
    # CC and CXX are unset, so name it here when it is installed (a warm machine's CI run).
    local cc=clang cxx=clang++
    if command -v ccache >/dev/null; then cc="ccache clang" cxx="ccache clang++"; fi
    # -Db_lundef=false: the sanitizer runtimes resolve some symbols only at load time.
    # -Dmpi=disabled: the sanitized binaries never run under mpirun (the zero suite is not among
    # the selected tests), and Open MPI's libraries stay out of LeakSanitizer's view.
    # -g1: line tables only, which is all a sanitizer's or libFuzzer's stack trace reads (file,
    # line, function); full debug info made each object ~30 % slower to compile. clang rather
    # than gcc: gcc's UBSan at -O2 compiled the engine 2.8 times slower (README "CI time").
    CC="$cc" CXX="$cxx" meson setup build-asan -Dcuda=disabled -Dmpi=disabled -Db_lundef=false \
      -Db_sanitize=address,undefined -Dcpp_args="-fno-sanitize-recover=all -g1" \
      -Dc_args="-fno-sanitize-recover=all -g1" -Dfuzz=true -Dfuzz_seconds="$seconds" >/dev/null
  else
    meson configure build-asan -Dfuzz_seconds="$seconds"
  fi
}
