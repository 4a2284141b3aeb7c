# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""Where dcu.serving puts things on a host: the one place these paths are spelled. The roles read them (filter
host_path), and so do the modules that look at what the roles left (serving_audit, cluster_health) and dcu-doctor
(src/dcu_serving/host_paths.py is a symlink to this file). Standard library only, Python 3.6+.

The fixed roots are docs/design.md's: configuration /etc/dcu-serving, state /var/lib/dcu-serving, logs
/var/log/dcu-serving, the proxy's Python env /opt/dcu-serving/venv."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import posixpath

CONFIG_DIR = "/etc/dcu-serving"
STATE_DIR = "/var/lib/dcu-serving"
LOG_DIR = "/var/log/dcu-serving"
UNIT_DIR = "/etc/systemd/system"

PATHS = {
    "config_dir": CONFIG_DIR,
    "state_dir": STATE_DIR,
    "log_dir": LOG_DIR,
    # dcu_proxy: its configuration and unit; the defaults of dcu_proxy_venv and dcu_proxy_results_log
    "proxy_config": CONFIG_DIR + "/proxy.yml",
    "proxy_unit": UNIT_DIR + "/dcu-proxy.service",
    "proxy_tls_dir": CONFIG_DIR + "/tls",  # the API's certificate and key (dcu_proxy_tls)
    "proxy_venv": "/opt/dcu-serving/venv",
    "results_log": LOG_DIR + "/results.jsonl",
    # dcu_vllm: one <instance>.env per instance, the template unit, the host runtime's state
    "vllm_env_dir": CONFIG_DIR + "/vllm",
    "vllm_unit": UNIT_DIR + "/vllm@.service",
    "vllm_state_dir": STATE_DIR + "/vllm",
    # dcu_monitoring: the cards' services the exporter labels by, its unit
    "exporter_services": CONFIG_DIR + "/exporter-services.json",
    "exporter_unit": UNIT_DIR + "/dcu-exporter.service",
    # dcu_driver: what it installed (the installer's sum, the package), the DTK, who may open the cards
    "install_record": STATE_DIR + "/rock-install.json",
    "dtk_record": STATE_DIR + "/dtk-install.json",
    "access_record": STATE_DIR + "/device-access.json",
    "reboot_marker": "/run/dcu-driver.reboot-required",
    "driver_boot_unit": UNIT_DIR + "/dcu-driver.service",
    # dcu_bundle: the default staging directory of a bundle on a host (dcu_bundle_stage_dir)
    "bundle_stage_dir": STATE_DIR + "/bundle",
}


def host_path(name):
    """The path `name` stands for; a KeyError naming the known names for another."""
    try:
        return PATHS[name]
    except KeyError:
        raise KeyError("no host path named {!r}; the known ones: {}".format(name, ", ".join(sorted(PATHS)))) from None


def relative(name, root):
    """The path under `root` ('/etc' -> 'dcu-serving/proxy.yml'), for a reader that maps roots (dcu-doctor's
    test trees)."""
    path = host_path(name)
    if not (path == root or path.startswith(root.rstrip("/") + "/")):
        raise ValueError("{} ({}) is not under {}".format(name, path, root))
    return posixpath.relpath(path, root)
