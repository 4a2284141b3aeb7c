# Runs inside the node image's chroot.
# No getty or udev-triggered units in a container; keep boot quiet and fast.
systemctl mask getty@tty1.service console-getty.service systemd-udevd.service \
  systemd-udev-trigger.service systemd-remount-fs.service sys-kernel-debug.mount \
  systemd-logind.service >/dev/null 2>&1 || true
systemctl enable docker.service >/dev/null 2>&1 || true
# A persistent journal, as on most servers: what a boot before a reboot said stays readable (journalctl -b -1).
mkdir -p /var/log/journal
# Inside a container the only storage driver that works without extra privileges is vfs.
mkdir -p /etc/docker
printf '{\n  "storage-driver": "vfs"\n}\n' >/etc/docker/daemon.json
# The DCU emulation: a oneshot that plays kernel + udev at every boot (docs/emulation.md).
install -D -m 0755 /tmp/recipe/files/dcu-emu-boot /usr/local/lib/dcu-emu/boot
install -m 0644 /tmp/recipe/files/profiles.json /tmp/recipe/files/os-profiles.json /tmp/recipe/files/dcuemu.py \
  /usr/local/lib/dcu-emu/
# The OS profile's docker CLI and SELinux tools (dcu-emu-boot puts them in place when the profile asks).
install -m 0755 /tmp/recipe/files/docker-compat /tmp/recipe/files/selinux-compat /usr/local/lib/dcu-emu/
# A physical server: systemd-detect-virt says none (the real one would name the container).
install -m 0755 /tmp/recipe/files/systemd-detect-virt /usr/local/bin/systemd-detect-virt
install -D -m 0755 /tmp/recipe/files/modprobe /usr/local/sbin/modprobe
install -m 0644 /tmp/recipe/files/dcu-emu.service /etc/systemd/system/dcu-emu.service
install -D -m 0755 /tmp/recipe/files/dcu-emu-activity /usr/local/lib/dcu-emu/activity
install -m 0644 /tmp/recipe/files/dcu-emu-activity.service /etc/systemd/system/dcu-emu-activity.service
install -m 0644 /tmp/recipe/files/dcu-emu.env /etc/dcu-emu.env
systemctl enable dcu-emu.service dcu-emu-activity.service >/dev/null
