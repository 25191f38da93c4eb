# vm-common.sh: what tools/rxe-vm and tools/rxe-hosts share, sourced by both (not run).
#
#   vm_die CODE MESSAGE     one line "$vm_tool: MESSAGE" on stderr, exit CODE
#   vm_require              install (as root) what the host needs, or exit 120; sets $kver
#   vm_initrd MODULE...     an initramfs that loads MODULE... (with their dependencies) and
#                           pivots onto the host FS; sets $initrd (cached per kernel and list)
#   shq WORD                WORD quoted for the guest's dash
#   vm_env_lines NAME...    "export NAME='value'" lines for the named variables that are set,
#                           the fixed set every guest gets, and every RVERBS_* variable
#
# The caller sets $vm_tool (its name, for messages) before sourcing.

vm_die() { local code=$1; shift; echo "${vm_tool:-vm}: $*" >&2; exit "$code"; }

# --- What the host needs: QEMU, a Debian kernel with rdma_rxe, busybox, rdma-core.
vm_require() {
  local missing=()
  command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
  command -v busybox >/dev/null && busybox --list 2>/dev/null | grep -x cpio >/dev/null || missing+=(busybox-static)
  command -v rdma >/dev/null || missing+=(iproute2)
  command -v modprobe >/dev/null || missing+=(kmod)
  command -v cpio >/dev/null || missing+=(cpio)
  command -v ibv_devices >/dev/null || missing+=(ibverbs-utils)
  ls /usr/lib/*/libibverbs/librxe-rdmav*.so >/dev/null 2>&1 || missing+=(ibverbs-providers rdma-core)
  compgen -G "/boot/vmlinuz-*" >/dev/null || missing+=(linux-image-amd64)
  if [[ ${#missing[@]} -gt 0 ]]; then
    [[ $(id -u) -eq 0 ]] || vm_die 120 "missing packages ${missing[*]} and not root to install them"
    echo "$vm_tool: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null 2>&1 || vm_die 120 "apt-get update failed"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/rxe-vm-apt.log 2>&1 \
      || vm_die 120 "could not install ${missing[*]} (see /tmp/rxe-vm-apt.log)"
  fi
  kver=$(ls /lib/modules 2>/dev/null | sort -V | tail -1)
  [[ -n $kver && -e /boot/vmlinuz-$kver ]] || vm_die 120 "no kernel with modules under /lib/modules (install linux-image-amd64)"
  modprobe -S "$kver" --show-depends rdma_rxe >/dev/null 2>&1 || vm_die 120 "kernel $kver has no rdma_rxe module"
}

# --- An initramfs that loads the modules and pivots onto the host FS. Cached per kernel and
# module list, so tools that need different modules do not rebuild each other's.
vm_initrd() {
  local key cache
  key=$(printf '%s\n' "$@" | md5sum | cut -c1-8)
  cache=${RVERBS_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rverbs-rxe-vm}/$kver-$key
  initrd=$cache/initrd.gz
  [[ -s $initrd ]] && return 0
  rm -rf "$cache"; mkdir -p "$cache/root"/{bin,mods,proc,sys,dev,host,newroot,rw}
  cp "$(command -v busybox)" "$cache/root/bin/busybox"
  local m
  for m in "$@"; do
    modprobe -S "$kver" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'
  done | awk '!seen[$0]++' > "$cache/order"
  while read -r f; do cp "$f" "$cache/root/mods/"; basename "$f"; done < "$cache/order" > "$cache/root/mods/order"
  cat > "$cache/root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(cat /mods/order); do insmod /mods/$m 2>/dev/null || echo "rxe-vm-init: insmod $m failed"; done
fail() { echo "rxe-vm-init: $*"; poweroff -f; }
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose host /host || fail "9p root mount failed"
mount -t tmpfs tmpfs /rw && mkdir -p /rw/up /rw/work
mount -t overlay overlay -o lowerdir=/host,upperdir=/rw/up,workdir=/rw/work /newroot || fail "overlay failed"
mount --move /proc /newroot/proc; mount --move /sys /newroot/sys; mount --move /dev /newroot/dev
# Unknown name=value kernel arguments reach init as environment variables.
exec chroot /newroot /bin/sh "$rverbs_stage2"
INIT
  chmod +x "$cache/root/init"
  (cd "$cache/root" && find . | cpio -o -H newc 2>/dev/null | gzip -1 > ../initrd.gz.tmp) \
    && mv "$cache/initrd.gz.tmp" "$initrd" || vm_die 120 "could not build the initramfs"
}

# The guest runs stage 2 with /bin/sh (dash), so every word is quoted the POSIX way: in
# single quotes, each ' as '\''. (Bash's printf %q may write $'...', which dash reads as a
# literal '$' followed by a quoted string.) The words reach the guest's shell unchanged:
# nothing in them is expanded on the host or by stage 2 itself.
shq() { local s=${1//\'/\'\\\'\'}; printf "'%s'" "$s"; }

vm_env_lines() {
  local v names=(PATH HOME CARGO_HOME RUSTUP_HOME RUST_BACKTRACE RUST_LOG CI "$@")
  names+=($(compgen -e | grep '^RVERBS_' || true))
  for v in "${names[@]}"; do
    [[ -n ${!v+x} ]] && printf 'export %s=%s\n' "$v" "$(shq "${!v}")"
  done
  return 0
}
