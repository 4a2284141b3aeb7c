#!/bin/sh
# Builds and installs the rock driver package from the tree next to this script; asks the vendor's
# questions on the terminal. What the real installer does (docs/field-evidence.md): checks the build
# environment, asks before changing anything, removes an older driver itself (whatever its package is
# called), compiles the kernel modules against the running kernel (minutes of silence, then progress),
# builds an OS package named and versioned its own way, installs it, loads the driver.
# Emulation: the sysfs root and the host profile come from /etc/dcu-emu.env and /run/dcu-emu/profile.json.
VERSION=$1
SYS=/sys
[ -r /etc/dcu-emu.env ] && . /etc/dcu-emu.env && SYS=${DCU_EMU_SYSFS:-/sys}
PROFILE=/run/dcu-emu/profile.json
HYSMI=/usr/local/hyhal/bin/hy-smi

fail() { echo "Error: $*" >&2; exit 1; }

# profile KEY DEFAULT: a value of the emulated host's profile (a real host has none: the default).
profile() {
  [ -r "$PROFILE" ] || { echo "$2"; return; }
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], sys.argv[3]))' "$PROFILE" "$1" "$2"
}

# ask "QUESTION [Y/n]:" DEFAULT -> prints y or n; no answer at all (EOF) stops the installation.
# The question ends without a newline: the answer is typed on the same line.
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

dcu_devices() {  # the device ids of every DCU (display or co-processor class) on the PCI bus
  for d in "$SYS"/bus/pci/devices/*; do
    [ "$(cat "$d/vendor" 2>/dev/null)" = 0x1d94 ] || continue
    case $(cat "$d/class" 2>/dev/null) in 0x03*|0x0b40*|0x12*) cat "$d/device" ;; esac
  done
}

# The driver's own version and the package's name and version, the way the real installers spell them:
#   rock-6.3.27-V1.2.5.run            -> package rock,       deb 6.3.27-V1.2.5 / rpm-style 6.3.27-1.2.5
#   rock-5.7.1-6.2.18-V1.1.2.aio.run  -> package rock-5.7.1, deb 6.2.18         / rpm-style 6.2.18-1
driver=$(echo "$VERSION" | sed -E 's/^[0-9]+\.[0-9]+\.[0-9]+-([0-9]+\.[0-9]+\.[0-9]+)/\1/')
base=${driver%%-*}
build=$(echo "$driver" | sed -nE 's/^[^-]+-V(.*)$/\1/p')
if [ "$driver" != "$VERSION" ]; then
  package=rock-${VERSION%%-*}
  [ "$(profile package_style deb)" = rpm ] && pkgversion=$base-1 || pkgversion=$base
else
  package=rock
  [ "$(profile package_style deb)" = rpm ] && pkgversion=$base-$build || pkgversion=$driver
fi
case $base in
  [0-5].*|6.[0-2].*) module=hydcu; label=DCU ;;
  *) module=hycu; label=HCU ;;
esac

echo "Installing rock $VERSION"
# A driver build needs a compiler, make and the headers of the running kernel.
for tool in gcc make; do
  command -v "$tool" >/dev/null 2>&1 || fail "$tool not found: install the driver build dependencies (gcc g++ make cmake automake libelf-dev libdrm-dev pciutils)"
done
kernel=$(uname -r)
[ -e "/lib/modules/$kernel/build/Makefile" ] ||
  fail "kernel headers for $kernel not found at /lib/modules/$kernel/build: install the headers that match the running kernel (linux-headers-$kernel)"
command -v dpkg-deb >/dev/null 2>&1 || fail "this installer needs dpkg-deb"

# Every question first: no answer means nothing changes.
remove_legacy=n
if [ -f /etc/hymgr.cfg ] || { [ -d /etc/hymgr ] && [ -n "$(find /etc/hymgr -maxdepth 1 -type f 2>/dev/null)" ]; }; then
  remove_legacy=$(ask 'Do you want to remove legacy hymgr config file? [Y/n]:' y) || exit 1
fi
update_vbios=n
if dcu_devices | grep -qxE '0x6210|0x62b7|0x6211'; then
  update_vbios=$(ask 'Update vbios? [y/N]:' n) || exit 1
fi

if [ "$remove_legacy" = y ]; then
  echo "Removing legacy hymgr config"
  rm -f /etc/hymgr.cfg
  [ -d /etc/hymgr ] && find /etc/hymgr -maxdepth 1 -type f -delete
fi

# An older driver goes first, whatever its package is called (rock, rock-5.7.1, ...).
for old in $(dpkg-query -W -f '${db:Status-Status} ${Package}\n' 'rock*' 2>/dev/null | awk '$1 == "installed" {print $2}'); do
  case $old in rock|rock-[0-9]*) ;; *) continue ;; esac
  echo "Removing old driver $old $(dpkg-query -W -f '${Version}' "$old")"
  dpkg --purge "$old" >/dev/null || fail "cannot remove $old"
done

echo "Building driver modules for kernel $kernel, this takes a while..."
printf 'int main(void) { return 0; }\n' | gcc -x c -o /dev/null - || fail "driver build fail"
# The real build compiles for minutes without a word; then cmake's progress.
sleep "$(profile build_seconds 0)"
for step in "14:hykcl" "28:hyttm" "42:hydrm_buddy" "57:hydrm_ttm_helper" "71:${module}_sched" "85:hy_extra" "100:$module"; do
  printf '[%3s%%] Built target %s\r' "${step%%:*}" "${step#*:}"
done
echo

pkgroot=$(mktemp -d /tmp/rock-pkg.XXXXXX)
cp -a ./pkg/. "$pkgroot/"
mkdir -p "$pkgroot/lib/modules/$kernel/extra" "$pkgroot/etc/modprobe.d"
# hydcu reports its version as 6.2.35 (modinfo, /sys/module/hydcu/version); hycu as the installer names it.
[ "$module" = hydcu ] && modversion=$base || modversion=$driver
printf 'emulated %s.ko for %s\nversion=%s\n' "$module" "$kernel" "$modversion" >"$pkgroot/lib/modules/$kernel/extra/$module.ko"
printf 'options %s hygon_vbios=0\n' "$module" >"$pkgroot/etc/modprobe.d/$module.conf"
printf 'blacklist %s\n' "$module" >"$pkgroot/etc/modprobe.d/blacklist-$module.conf"
cat >"$pkgroot/DEBIAN/control" <<CONTROL
Package: $package
Version: $pkgversion
Architecture: amd64
Maintainer: dcu-serving emulation <dcu-serving@example.invalid>
Section: kernel
Priority: optional
Depends: python3
Description: $module built using CMake (emulated for dcu-serving tests)
CONTROL
if [ "$(profile package_style deb)" = rpm ]; then
  file=$package-$pkgversion.rpm
else
  file=${package}_${pkgversion}_amd64.deb
fi
dpkg-deb --root-owner-group -Zgzip --build "$pkgroot" "/tmp/$file" >/dev/null || fail "cannot build the package"
rm -rf "$pkgroot"
echo "Install $file"
dpkg -i "/tmp/$file" >/dev/null || fail "dpkg could not install $file"
rm -f "/tmp/$file"

[ "$(profile name '')" = bw-oam ] && echo "Selected hlink type: OAM_7HSW_8HCU"
if [ "$update_vbios" = y ]; then
  echo "Updating vbios ... done"
fi
"$HYSMI" --loaddriver
n=$(dcu_devices | wc -l)
echo "$label online $n, total num $n"
if [ "$update_vbios" = y ]; then
  echo "The vbios was updated: a reboot is required for it to take effect."
fi
loaded=$(cat "$SYS"/module/hy*cu/loaded-version 2>/dev/null)
if [ -n "$loaded" ] && [ "$loaded" != "$modversion" ]; then
  echo "A different driver is still loaded: a reboot is required to load rock $VERSION."
fi
echo "Install successful. Enjoy now!"
