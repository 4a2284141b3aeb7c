# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The container engine of a DCU host: which docker it is and which of our `docker run` options it accepts.

Kylin V10 and openEuler ship docker-engine 18.09; CentOS 7 DCU hosts carry docker-ce 19.03 or the distribution's
1.13 (docs/field-evidence.md O10). Their CLI refuses flags added later ("unknown flag: --pull"), so units render
only what the host's engine knows, and an engine older than the oldest supported is refused up front.
Shared by the roles (through dcu.serving.host_probe) and dcu-doctor (symlinked into src/dcu_serving/).
Python 2.7/3.6 compatible: it runs on old targets.
"""

import re

# The oldest engine supported: the oldest on the OSes DCU hosts run (docker-engine 18.09 on Kylin V10 and openEuler).
MINIMUM = (18, 9)
UPGRADE = ("install docker-ce or docker-engine 18.09 or later from the OS vendor's repository (Kylin V10 and "
           "openEuler ship docker-engine 18.09; CentOS 7: docker-ce 19.03 from the docker-ce repository mirror)")

# Optional `docker run` flags our units pass where the engine has them, with the release that added each:
# --pull=never (docker/cli#1498, released in 20.10) keeps an air-gapped host from trying a registry when an image
# is missing; without it docker tries to pull and fails, which preflight's image check makes moot.
RUN_FLAGS_SINCE = (("--pull=never", (20, 10)),)


def parse_version(text):
    """(major, minor, patch) from what docker prints of its version: '18.09.0', '20.10.24+dfsg1', '1.13.1',
    'Docker version 19.03.8, build afacb8b7f0', '24.0.7-ce'; None when the text holds no version."""
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def run_flags(version):
    """The optional `docker run` flags (RUN_FLAGS_SINCE) this engine version accepts; none for an unknown one."""
    if not version:
        return []
    return [flag for flag, since in RUN_FLAGS_SINCE if tuple(version[:2]) >= since]


def problem(text, engine="docker"):
    """'' when the engine that printed `text` (its server version) is supported; else what is wrong, and the fix."""
    version = parse_version(text)
    if version is None:
        return "{engine} did not say its version ({said!r}): is the engine running? (systemctl status {engine})".format(
            engine=engine, said=(text or "").strip()[:120])
    if tuple(version[:2]) < MINIMUM:
        return "{} {} is older than the oldest engine supported ({}.{:02d}): {}".format(
            engine, text.strip().splitlines()[0], MINIMUM[0], MINIMUM[1], UPGRADE)
    return ""
