#!/bin/sh
# rock @VERSION@ — Hygon HCU driver installer (self-extracting, makeself style).
# The payload after this script is a gzip'd tar of install.sh and the rock package.
VERSION='@VERSION@'
PAYLOAD_SIZE=@PAYLOAD_SIZE@
PAYLOAD_SHA256=@PAYLOAD_SHA256@

usage() {
  cat <<USAGE
rock $VERSION installer
Usage: $0 [options]
  -h, --help      print this help and exit
  -A              install for bare metal (recommended on physical hosts)
  --check         verify the archive integrity and exit
  --target DIR    extract the payload into DIR
  --noexec        with --target: extract only, do not install
The installer asks questions on the terminal; answer them on standard input.
USAGE
}

target= noexec= checkonly=
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    -A) shift ;;
    --check) checkonly=1; shift ;;
    --target) target=$2; shift 2 ;;
    --noexec) noexec=1; shift ;;
    *) echo "Unknown option: $1" >&2; usage >&2; exit 1 ;;
  esac
done

printf 'Verifying archive integrity... '
sum=$(tail -c "$PAYLOAD_SIZE" "$0" | sha256sum | cut -d' ' -f1)
if [ "$sum" != "$PAYLOAD_SHA256" ]; then
  echo "Error in checksums: $sum is different from $PAYLOAD_SHA256" >&2
  echo "The archive is corrupt; download it again." >&2
  exit 1
fi
echo "All good."
[ -z "$checkonly" ] || exit 0

if [ -z "$noexec" ] && [ "$(id -u)" -ne 0 ]; then
  echo "Error: the rock installer must be run as root" >&2
  exit 1
fi
if [ -n "$target" ]; then
  dir=$target; mkdir -p "$dir"
else
  dir=$(mktemp -d /tmp/rock-installer.XXXXXX)
  trap 'rm -rf "$dir"' EXIT
fi
echo "Uncompressing rock $VERSION"
tail -c "$PAYLOAD_SIZE" "$0" | tar -xzf - -C "$dir" || { echo "Error: cannot extract the payload" >&2; exit 1; }
[ -z "$noexec" ] || exit 0
(cd "$dir" && sh ./install.sh "$VERSION")
exit $?
