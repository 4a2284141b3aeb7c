"""The doctor as one zipapp, for hosts where dcu-serving is not installed (no proxy venv: a driver-only host,
or a proxy in its container): `python3 -m dcu_serving.doctor.pack OUT.pyz`, then `python3 OUT.pyz` there.

It holds the doctor and the modules it imports (addresses, host_paths, hysmi, dtk_driver, rock_version,
container_engine, host_kernel: symlinks into the collection's module_utils, stored as their content), nothing else
of dcu_serving: the standard library runs it.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent
MODULES = ("__init__.py", "addresses.py", "host_paths.py", "hysmi.py", "dtk_driver.py", "rock_version.py",
           "container_engine.py", "host_kernel.py")
MAIN = "import sys\n\nfrom dcu_serving.doctor.cli import main\n\nsys.exit(main())\n"


def pack(out: str) -> Path:
    target = Path(out)
    files = [PACKAGE / name for name in MODULES] + sorted((PACKAGE / "doctor").glob("*.py"))
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("__main__.py", MAIN)
        for path in files:
            archive.write(path, "dcu_serving/" + str(path.relative_to(PACKAGE)))
    return target


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python3 -m dcu_serving.doctor.pack OUT.pyz", file=sys.stderr)
        return 2
    print(pack(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
