# Copyright: dcu-serving contributors
# Apache License 2.0 (see the collection's LICENSE)
"""How dcu_proxy installs and runs dcu-proxy.

- proxy_runtime: `venv` (the host's python3) or `container` (the bundle's proxy image, its own Python),
  from what the host's interpreter is, dcu-serving's Requires-Python and the Python the bundle's wheels
  were built for.
- wheel_requires_python: the Requires-Python of a wheel (its METADATA), from the wheel's bytes.
- proxy_requirements: the hash-pinned requirements of exactly what pip resolved for dcu-serving[proxy]
  (its install report), with the SHA-256 sums of index.json.
- venv_build_dir: where a bundle's venv is built beside the running one, never over a venv in use (dcu_proxy,
  dcu_gateway).
"""

import base64
import binascii
import io
import posixpath
import re
import zipfile
from email.parser import HeaderParser

from ansible.errors import AnsibleFilterError

try:  # ansible-core depends on packaging; filters run on the controller
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version
except ImportError:  # pragma: no cover - reported when a filter is used
    SpecifierSet = Version = None

RUNTIMES = ("auto", "venv", "container")


def _normalize(name):
    """PEP 503 name: PyYAML, pyyaml and typing_extensions / typing-extensions compare equal."""
    return re.sub(r"[-_.]+", "-", str(name)).lower()


def _major_minor(version):
    return ".".join(str(version).split(".")[:2])


def proxy_runtime(requested, python, requires_python=None, wheels_python=None, wheel=True):
    """{runtime, venv_possible, reason} for dcu_proxy_runtime `requested` (auto|venv|container).

    python: what the host's interpreter says, {"version": "3.6.8", "venv": true} (venv: the venv module and
    ensurepip are there), or {} when it could not run. requires_python: the Requires-Python of the bundle's
    dcu-serving wheel (None: no constraint). wheels_python: the Python version the bundle's wheels were
    downloaded for ("3.11"; None: unknown). wheel: whether the bundle holds the dcu-serving wheel at all.
    `auto` runs the venv when it is possible, else the container.
    """
    if requested not in RUNTIMES:
        raise AnsibleFilterError("dcu_proxy_runtime must be one of %s, got %r" % (", ".join(RUNTIMES), requested))
    if SpecifierSet is None:
        raise AnsibleFilterError("proxy_runtime needs the Python package 'packaging' on the controller")
    python = python or {}
    version = python.get("version")
    if not wheel:
        possible, reason = False, "the bundle holds no dcu-serving wheel"
    elif not version:
        possible, reason = False, "the host's python3 did not run (%s)" % (python.get("error") or "not found")
    else:
        try:
            spec = SpecifierSet(requires_python or "")
            satisfied = Version(version) in spec
        except (InvalidSpecifier, InvalidVersion) as e:
            raise AnsibleFilterError("cannot compare Python %r with Requires-Python %r: %s"
                                     % (version, requires_python, e)) from e
        if not satisfied:
            possible, reason = False, ("the host's python3 is %s; dcu-serving requires Python %s"
                                       % (version, requires_python))
        elif wheels_python and _major_minor(version) != _major_minor(wheels_python):
            possible, reason = False, ("the host's python3 is %s; the bundle's wheels are built for Python %s"
                                       % (version, wheels_python))
        elif not python.get("venv"):
            possible, reason = False, ("the host's python3 %s lacks the venv module with ensurepip "
                                       "(Debian and Ubuntu: the python3-venv package)" % version)
        else:
            possible, reason = True, ("the host's python3 %s satisfies Requires-Python %s and matches the "
                                      "bundle's wheels" % (version, requires_python or "(none)"))
    runtime = ("venv" if possible else "container") if requested == "auto" else requested
    return {"runtime": runtime, "venv_possible": possible, "reason": reason}


def wheel_requires_python(content):
    """Requires-Python of a wheel given as base64 (what slurp returns), or None when it states none."""
    try:
        with zipfile.ZipFile(io.BytesIO(base64.b64decode(content))) as wheel:
            names = [n for n in wheel.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
            if len(names) != 1:
                raise AnsibleFilterError("the wheel holds %d .dist-info/METADATA files, not one" % len(names))
            metadata = HeaderParser().parsestr(wheel.read(names[0]).decode("utf-8"))
    except (zipfile.BadZipFile, binascii.Error, ValueError) as e:
        raise AnsibleFilterError("not a wheel: %s" % e) from e
    value = metadata.get("Requires-Python")
    return value.strip() if value else None


def proxy_requirements(report, wheels):
    """Sorted `name==version --hash=sha256:<sum>` lines for every package pip's install report resolved.

    report: the JSON of `pip install --dry-run --report` (a string or the parsed mapping); wheels: the
    wheel artifacts of index.json ({name, version, sha256, file}). A resolved package that index.json does
    not list (a stray file in the wheelhouse) is an error naming it: nothing is installed unchecked.
    """
    if isinstance(report, str):
        import json

        try:
            report = json.loads(report)
        except ValueError as e:
            raise AnsibleFilterError("pip's install report is not JSON: %s" % e) from e
    installs = (report or {}).get("install")
    if not installs:
        raise AnsibleFilterError("pip's install report resolved nothing to install")
    by_name = {}
    for wheel in wheels or []:
        by_name.setdefault(_normalize(wheel["name"]), []).append(wheel)
    lines, unknown = [], []
    for item in installs:
        meta = item.get("metadata") or {}
        name, version = meta.get("name"), meta.get("version")
        match = [w for w in by_name.get(_normalize(name), []) if _same_version(w.get("version"), version)]
        url = (item.get("download_info") or {}).get("url") or ""
        if len(match) > 1 and url:  # several files of one version (platforms): the one pip chose
            match = [w for w in match if url.rsplit("/", 1)[-1] == str(w.get("file", "")).rsplit("/", 1)[-1]]
        if len(match) != 1:
            unknown.append("%s %s" % (name, version))
            continue
        lines.append("%s==%s --hash=sha256:%s" % (_normalize(name), version, match[0]["sha256"]))
    if unknown:
        raise AnsibleFilterError(
            "pip resolved %s from the wheelhouse, which index.json does not list: the staged wheels are not "
            "the bundle's; stage the bundle again" % ", ".join(sorted(unknown)))
    return sorted(lines)


def _same_version(a, b):
    try:
        return Version(str(a)) == Version(str(b))
    except (InvalidVersion, TypeError):
        return str(a) == str(b)


def venv_build_dir(path, digest, current=None, previous=None, current_digest=None, previous_digest=None):
    """Where the venv a bundle makes (`digest`, of its wheels and Python) lives: `<path>-<digest[:12]>` beside
    the venv path `path` (a symlink, dcu.serving.venv_link).

    It is the venv the link names now (`current`) or the previous one (`previous`, a switch back needs no build)
    when that venv's marker says it was built from `digest` (`current_digest`, `previous_digest`). Otherwise it is
    never either of them: a build begins by removing its directory, and a service runs from one of them - a marker
    that cannot be read must not cost the running venv. Then `<path>-<digest[:12]>-2` (or `-3`), a fresh directory.
    """
    parent, name = posixpath.split(path.rstrip("/"))
    current, previous = [posixpath.basename((link or "").rstrip("/")) for link in (current, previous)]
    for venv, marker in ((current, current_digest), (previous, previous_digest)):
        if venv and (marker or "").strip() == digest:
            return posixpath.join(parent, venv)
    base = "%s-%s" % (name, digest[:12])
    free = next(candidate for candidate in (base, base + "-2", base + "-3") if candidate not in (current, previous))
    return posixpath.join(parent, free)
