#!/usr/bin/env bash
# ansible-test sanity over what the collection tarball ships, without the internet.
#
#   tests/sanity/run.sh wheels       fill the sanity wheelhouse: offline when it already holds every pin,
#                                    else from PyPI (the one step that may use the network)
#   tests/sanity/run.sh [ARGS...]    build the collection, unpack it at
#                                    build/sanity/ansible_collections/dcu/serving with tests/sanity/, and run
#                                    `ansible-test sanity --local ARGS` there; nothing is fetched
#
# Why a wheelhouse and a HOME of its own: ansible-test runs every sanity test in a virtual environment of
# its own (~/.ansible/test/venv), installs into it the exact versions it pins for that test
# (ansible_test/_data/requirements/sanity.*.txt: PyYAML, pylint, voluptuous, antsibull-changelog, ...),
# and bootstraps pip in it with a get-pip script from ci-files.testing.ansible.com. It does so with --local
# and --venv alike, and passes no PIP_* variable through. Those pins differ from requirements/constraints.txt
# (PyYAML, packaging, MarkupSafe, platformdirs), so they cannot live in .venv; they are fixed by the
# ansible-core version that constraints.txt pins. Here ansible-test gets HOME=build/sanity/home, where
#   .config/pip/pip.conf                 says no-index, find-links = the wheelhouse
#   .ansible/test/cache/get_pip_<v>.py   installs pip <v> from the wheelhouse instead of downloading it
# Environment: ANSIBLE_TEST (default: ansible-test on PATH; its venv's python is used),
# DCU_SANITY_WHEELS (default: build/sanity/wheels; copy a filled one here for an air-gapped machine).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$root/build/sanity
wheels=${DCU_SANITY_WHEELS:-$work/wheels}
ansible_test=$(command -v "${ANSIBLE_TEST:-ansible-test}") || {
  echo "ansible-test not found: run make venv (or set ANSIBLE_TEST)" >&2; exit 2; }
bindir=$(dirname "$ansible_test")
python=$bindir/python
[ -x "$python" ] || python=python3

at_dir=$("$python" -c 'import ansible_test, os; print(os.path.dirname(ansible_test.__file__))')
core=$("$python" -c 'from ansible.release import __version__; print(__version__)')
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
# ansible-test's bootstrap packages (get_venv_packages' defaults): pip, and before 2.17 setuptools and wheel.
mapfile -t bootstrap < <(sed -n "/default_packages = dict(/,/)/s/^ *\([a-z]*\)='\([0-9.]*\)',.*/\1==\2/p" \
  "$at_dir/_internal/python_requirements.py")
pip_version=$(printf '%s\n' "${bootstrap[@]}" | sed -n 's/^pip==//p')
# The requirement files of the tests that run on a collection (mypy is ansible-core's own).
requirements=()
for f in "$at_dir"/_data/requirements/sanity.*.txt; do
  case $f in */sanity.mypy.txt) ;; *) requirements+=(-r "$f") ;; esac
done

fill_wheels() {
  mkdir -p "$wheels"
  local args=(download --quiet --disable-pip-version-check --only-binary=:all: --dest "$wheels"
              "${bootstrap[@]}" "${requirements[@]}")
  if "$python" -m pip "${args[@]}" --no-index --find-links "$wheels" >/dev/null 2>&1; then
    echo "sanity wheelhouse $wheels holds ansible-test $core's pins for Python $pyver"
  else
    echo "filling the sanity wheelhouse $wheels from the package index (ansible-test $core, Python $pyver)"
    "$python" -m pip "${args[@]}"
  fi
}

if [ "${1:-}" = wheels ]; then
  fill_wheels
  # ansible-test's shellcheck test is skipped without the tool: a skipped test proves nothing.
  if ! command -v shellcheck >/dev/null 2>&1; then
    echo "installing shellcheck from Debian (ansible-test sanity skips its shell checks without it)"
    if [ "$(id -u)" -ne 0 ]; then sudo=sudo; else sudo=; fi
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq shellcheck >/dev/null
  fi
  exit
fi

pip_wheels=("$wheels"/pip-"$pip_version"-*.whl)
if [ ! -f "${pip_wheels[0]}" ]; then
  echo "no sanity wheelhouse for ansible-test $core at $wheels: run '$0 wheels' once where PyPI is" \
       "reachable, or copy a filled one there (DCU_SANITY_WHEELS)" >&2
  exit 2
fi

home=$work/home
mkdir -p "$home/.config/pip" "$home/.ansible/test/cache"
cat >"$home/.config/pip/pip.conf" <<EOF
[global]
no-index = true
find-links = $wheels
disable-pip-version-check = true
EOF
# Stand-in for get-pip-<v>.py: ansible-test runs it in an empty venv as
#   get_pip <packages> [--no-setuptools] [--no-wheel]
cat >"$home/.ansible/test/cache/get_pip_${pip_version//./_}.py" <<EOF
"""Install pip $pip_version from the sanity wheelhouse (written by tests/sanity/run.sh)."""
import sys

sys.path.insert(0, "${pip_wheels[0]}")
from pip._internal.cli.main import main  # noqa: E402  (imported from the wheel)

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(main(["install", "--no-index", "--find-links", "$wheels"] + args))
EOF

# What the collection ships, plus the sanity ignore files and tests/config.yml (modules' Python versions).
coll=$work/ansible_collections/dcu/serving
rm -rf "$work/ansible_collections" "$work/dist"
mkdir -p "$coll/tests" "$work/dist"
"$bindir/ansible-galaxy" collection build --output-path "$work/dist" "$root" >/dev/null
tar -xzf "$work"/dist/dcu-serving-*.tar.gz -C "$coll"
cp -r "$root/tests/sanity" "$root/tests/config.yml" "$coll/tests/"
# A repository of its own: ansible-test lists files with git from the nearest .git upwards, and the
# checkout's would list nothing under build/ (ignored). Nothing is committed; untracked files count.
git init -q "$coll"

cd "$coll"
HOME=$home "$ansible_test" sanity --local --python "$pyver" --color no "$@"
