# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""What DCU cards need from the host's kernel, said once for dcu_vllm's preflight and dcu-doctor (symlinked into
src/dcu_serving/). Tensor parallel over PCIe cards: RCCL warns without iommu=pt on the kernel command line and with
NUMA auto balancing on, and Hygon's guide turns IOMMU and ACS off for PCIe cards (docs/field-evidence.md K1); BW
hosts need vm.max_map_count of at least 262144 (O13). Python 2.7/3.6 compatible: it runs on old targets."""

import re

# BW hosts: inference fails mapping memory below this (Hygon ontrack reports).
MAX_MAP_COUNT = 262144
_IOMMU_OFF_OR_PASSTHROUGH = re.compile(r"(?:^|\s)(?:iommu=pt|iommu=off|amd_iommu=off|intel_iommu=off)(?:\s|$)")


def tensor_parallel_problems(cmdline, numa_balancing):
    """[(what is wrong, the fix)] for tensor parallel over PCIe on a kernel with this command line and
    /proc/sys/kernel/numa_balancing; [] when neither matters. Unreadable values (None) say nothing."""
    problems = []
    if cmdline is not None and not _IOMMU_OFF_OR_PASSTHROUGH.search(cmdline):
        problems.append(("the kernel command line has no iommu=pt: RCCL's peer-to-peer traffic between PCIe cards goes "
                         "through the IOMMU",
                         "add iommu=pt to GRUB_CMDLINE_LINUX, update the boot loader and reboot; turn off ACS in the "
                         "BIOS for PCIe cards (OAM modules need neither)"))
    if numa_balancing is not None and str(numa_balancing).strip() not in ("", "0"):
        problems.append(("NUMA auto balancing is on: RCCL warns and throughput fluctuates",
                         "sysctl -w kernel.numa_balancing=0, and keep it (dcu_driver_sysctl: {kernel.numa_balancing: "
                         "0})"))
    return problems


def map_count_problem(value):
    """'' when vm.max_map_count (its text) is enough for a BW host, or unreadable; else what is wrong."""
    text = str(value or "").strip()
    if text.isdigit() and int(text) < MAX_MAP_COUNT:
        return "vm.max_map_count is {} on a BW host; inference there needs {} or more".format(text, MAX_MAP_COUNT)
    return ""
