#!/bin/sh
# Installs the rock driver package carried next to this script; asks the vendor's questions on stdin.
# Emulation: the sysfs root comes from /etc/dcu-emu.env (a real host has /sys).
VERSION=$1
SYS=/sys
[ -r /etc/dcu-emu.env ] && . /etc/dcu-emu.env && SYS=${DCU_EMU_SYSFS:-/sys}
HYSMI=/opt/hyhal/bin/hy-smi

fail() { echo "Error: $*" >&2; exit 1; }

# ask "QUESTION [Y/n]:" DEFAULT -> prints y or n; no answer at all (EOF) stops the installation.
ask() {
  while :; do
    printf '%s ' "$1" >&2
    if ! IFS= read -r answer; then
      echo >&2
      fail "no answer to \"$1\": the installer cannot continue without an answer. Nothing was installed."
    fi
    case $answer in
      '') echo "$2"; return ;;
      y|Y|yes|YES|Yes) echo y; return ;;
      n|N|no|NO|No) echo n; return ;;
      *) echo "Please answer y or n." >&2 ;;
    esac
  done
}

dcu_devices() {  # the device ids of every DCU on the PCI bus
  for d in "$SYS"/bus/pci/devices/*; do
    [ "$(cat "$d/vendor" 2>/dev/null)" = 0x1d94 ] && cat "$d/device"
  done
}

echo "Installing rock $VERSION"
# A driver build needs a compiler, make and the headers of the running kernel.
for tool in gcc make; do
  command -v "$tool" >/dev/null 2>&1 || fail "$tool not found: install the driver build dependencies (gcc g++ make cmake automake libelf-dev libdrm-dev pciutils)"
done
kernel=$(uname -r)
[ -e "/lib/modules/$kernel/build/Makefile" ] ||
  fail "kernel headers for $kernel not found at /lib/modules/$kernel/build: install the headers that match the running kernel (linux-headers-$kernel)"
command -v dpkg >/dev/null 2>&1 || fail "this installer needs dpkg"

# Every question first: no answer means nothing changes.
remove_legacy=n
if [ -d /etc/hymgr ] && [ -n "$(find /etc/hymgr -maxdepth 1 -type f 2>/dev/null)" ]; then
  remove_legacy=$(ask 'Do you want to remove legacy hymgr config file? [Y/n]:' y) || exit 1
fi
update_vbios=n
if dcu_devices | grep -qxE '0x6210|0x62b7'; then
  update_vbios=$(ask 'Update vbios? [y/N]:' n) || exit 1
fi

if [ "$remove_legacy" = y ]; then
  echo "Removing legacy hymgr config in /etc/hymgr"
  find /etc/hymgr -maxdepth 1 -type f -delete
fi

old=$(dpkg-query -W -f '${db:Status-Status} ${Version}' rock 2>/dev/null)
case $old in
  "installed $VERSION") echo "rock $VERSION is already installed, reinstalling" ;;
  installed*) echo "Removing old driver rock ${old#installed }"; dpkg --purge rock >/dev/null || fail "cannot remove rock ${old#installed }" ;;
esac

echo "Building driver modules for kernel $kernel"
printf 'int main(void) { return 0; }\n' | gcc -x c -o /dev/null - || fail "the module build failed (gcc)"
dpkg -i ./rock_*.deb >/dev/null || fail "dpkg could not install the rock package"

if [ "$update_vbios" = y ]; then
  echo "Updating vbios ... done"
fi
"$HYSMI" --loaddriver
n=$(dcu_devices | wc -l)
echo "HCU online $n, total num $n"
if [ "$update_vbios" = y ]; then
  echo "The vbios was updated: a reboot is required for it to take effect."
fi
case $("$HYSMI" --showdriverversion 2>/dev/null) in
  *"Driver Version: $VERSION"*) ;;
  *) echo "A different driver is still loaded: a reboot is required to load rock $VERSION." ;;
esac
echo "Install successful. Enjoy now!"
