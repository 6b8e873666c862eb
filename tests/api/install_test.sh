#!/bin/bash
# tests/api/install_test.sh — installs the build into a temporary prefix and proves an outside
# program needs nothing else: each examples/*.c is compiled out of tree with only
# `cc $(pkg-config --cflags --libs strata)` and run; the installed Python package lies where
# python3 itself searches under the prefix, imports from there and reports the version.
# Args: BUILD_DIR SOURCE_DIR.
set -euo pipefail
build=$1
src=$2
mkdir -p "${STRATA_TEST_TMPDIR:-/tmp}"
work=$(mktemp -d "${STRATA_TEST_TMPDIR:-/tmp}/install.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
meson install -C "$build" --quiet --no-rebuild --destdir "$work/dest" >/dev/null
# --destdir keeps the configured prefix under dest; point everything at that tree.
configured=$(meson introspect "$build" --buildoptions | /usr/bin/python3 -c \
  'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"))')
root=$work/dest$configured
pcdir=$(dirname "$(find "$root" -name strata.pc | head -1)")
test -n "$pcdir" || { echo "strata.pc not installed"; exit 1; }
test -x "$root/bin/strata" || { echo "the strata CLI was not installed"; exit 1; }
# The .pc file names the configured prefix; redirect it to where the files are now.
export PKG_CONFIG_PATH=$pcdir
flags=$(pkg-config --define-variable=prefix="$root" --cflags --libs strata)
libdir=$(pkg-config --define-variable=prefix="$root" --variable=libdir strata)
# Only strata_* symbols may be exported.
if nm -D --defined-only "$libdir/libstrata.so" | awk '{print $3}' | grep -v '^strata_' | grep -v '^STRATA_[0-9]*$' | grep -q .; then
  echo "libstrata exports symbols other than strata_*:"
  nm -D --defined-only "$libdir/libstrata.so" | awk '{print $3}' | grep -v '^strata_' | head
  exit 1
fi
readelf -d "$libdir/libstrata.so" | grep -q 'SONAME.*libstrata.so.0' || { echo "no SONAME libstrata.so.0"; exit 1; }
for example in io store scheduler optimizer; do
  cc -O1 -o "$work/$example" "$src/examples/${example}_example.c" $flags
  LD_LIBRARY_PATH=$libdir "$work/$example" "$work/run_$example"
done
site=$(dirname "$(find "$root" -path '*/strata/__init__.py' | head -1)")
test -n "$site" || { echo "python package not installed"; exit 1; }
# Issue 29: the package must land where python3 itself searches under the prefix (it went to
# lib/python3/dist-packages, which Debian's python3 does not search under /usr/local). Its own
# sys.path entries under the configured prefix (-E: without PYTHONPATH), moved into dest, are
# the only place the import may look. A private prefix has none: PYTHONPATH is its documented
# way, so there the package is imported from where it was found.
searched=$(/usr/bin/python3 -E -c 'import os, sys
prefix = os.path.normpath(sys.argv[1]); dest = sys.argv[2]
print(":".join(dest + entry for entry in sys.path
               if os.path.basename(entry) in ("dist-packages", "site-packages")
               and os.path.relpath(entry, prefix).startswith("lib")))' "$configured" "$work/dest")
if [ "$configured" = /usr/local ] || [ "$configured" = /usr ]; then
  test -n "$searched" || { echo "python3 searches nothing under $configured"; exit 1; }
  case ":$searched:" in
    *":$(dirname "$site"):"*) ;;
    *) echo "python package installed in $(dirname "$site"), not where python3 searches: $searched"; exit 1 ;;
  esac
  python_path=$searched
else
  echo "python: prefix $configured is not on python3's path; importing from $(dirname "$site") with PYTHONPATH"
  python_path=$(dirname "$site")
fi
LD_LIBRARY_PATH=$libdir STRATA_LIBRARY=$libdir/libstrata.so.0 PYTHONPATH=$python_path \
  /usr/bin/python3 -c 'import strata; print("python: strata", strata.__version__, strata.__file__)'
# Without STRATA_LIBRARY the package falls back to the loader's search (here LD_LIBRARY_PATH;
# a real --prefix install finds the libdir recorded in _install_paths.py first).
env -u STRATA_LIBRARY LD_LIBRARY_PATH=$libdir PYTHONPATH=$python_path /usr/bin/python3 -c \
  'import strata, sys; sys.exit(0 if strata.__version__ else 1)'
echo "install test: ok"
