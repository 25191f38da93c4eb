//! dma-buf registration on a real device, with a real dma-buf: a DRM dumb buffer of the
//! kernel's `vgem` driver exported with PRIME (tools/rxe-vm loads vgem). rxe and siw cannot
//! register dma-buf memory: the refusal must be clean (the error says so, the descriptor is
//! closed, no memory region is left). A device that can (mlx5, efa, irdma, bnxt_re) must
//! register it and close the descriptor only when the region goes.
#![allow(clippy::std_instead_of_core)] // test code: std is the natural vocabulary here

mod support;

use std::ffi::{c_int, c_ulong};
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};

use rverbs_core::verbs::{AccessFlags, DmabufFd, VerbsError};

extern "C" {
    fn ioctl(fd: c_int, request: c_ulong, ...) -> c_int;
}

// include/uapi/drm/drm.h and drm_mode.h: DRM_IOWR(nr, type) is _IOWR('d', nr, type).
#[repr(C)]
#[derive(Default, Debug)]
struct DrmModeCreateDumb {
    height: u32,
    width: u32,
    bpp: u32,
    flags: u32,
    handle: u32,
    pitch: u32,
    size: u64,
}
#[repr(C)]
#[derive(Default, Debug)]
struct DrmPrimeHandle {
    handle: u32,
    flags: u32,
    fd: i32,
}
#[repr(C)]
struct DrmModeDestroyDumb {
    handle: u32,
}

/// `_IOWR('d', nr, size)` of asm-generic/ioctl.h (x86-64: 2 direction bits at 30, 14 size
/// bits at 16, type at 8, number at 0).
const fn drm_iowr(nr: u32, size: usize) -> c_ulong {
    ((3u32 << 30) | ((size as u32) << 16) | ((b'd' as u32) << 8) | nr) as c_ulong
}
const DRM_IOCTL_MODE_CREATE_DUMB: c_ulong =
    drm_iowr(0xB2, std::mem::size_of::<DrmModeCreateDumb>());
const DRM_IOCTL_MODE_DESTROY_DUMB: c_ulong =
    drm_iowr(0xB4, std::mem::size_of::<DrmModeDestroyDumb>());
const DRM_IOCTL_PRIME_HANDLE_TO_FD: c_ulong = drm_iowr(0x2d, std::mem::size_of::<DrmPrimeHandle>());
/// DRM_CLOEXEC is O_CLOEXEC, DRM_RDWR is O_RDWR.
const DRM_CLOEXEC: u32 = 0o2_000_000;
const DRM_RDWR: u32 = 2;

#[test]
fn ioctl_numbers_match_the_kernel_headers() {
    // The values the kernel's macros give for these structs (sizes 32, 4 and 12).
    assert_eq!(DRM_IOCTL_MODE_CREATE_DUMB, 0xC020_64B2);
    assert_eq!(DRM_IOCTL_MODE_DESTROY_DUMB, 0xC004_64B4);
    assert_eq!(DRM_IOCTL_PRIME_HANDLE_TO_FD, 0xC00C_642D);
}

/// The vgem card (its primary node: dumb buffers are a primary-node ioctl), found by its
/// device path in sysfs (`/sys/class/drm/cardN -> ../../devices/platform/vgem/drm/cardN`).
/// If devtmpfs made no `/dev/dri/cardN` (the VM's 6.1 kernel makes only the render node for
/// vgem), the node is made under /tmp from the numbers sysfs gives.
fn vgem_card() -> Option<File> {
    for entry in std::fs::read_dir("/sys/class/drm").ok()?.flatten() {
        let name = entry.file_name().into_string().ok()?;
        if !name.starts_with("card") || name.contains('-') {
            continue;
        }
        let target = std::fs::read_link(entry.path()).ok()?;
        if !target.to_string_lossy().contains("/platform/vgem/") {
            continue;
        }
        let mut dev = format!("/dev/dri/{name}");
        if !std::path::Path::new(&dev).exists() {
            let numbers = std::fs::read_to_string(entry.path().join("dev")).ok()?;
            let (major, minor) = numbers.trim().split_once(':')?;
            dev = format!("/tmp/rverbs-dmabuf-{name}-{}", std::process::id());
            let st = std::process::Command::new("mknod")
                .args([&dev, "c", major, minor])
                .status()
                .expect("run mknod");
            assert!(st.success(), "mknod {dev} c {major} {minor}: {st}");
        }
        let card = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&dev)
            .unwrap_or_else(|e| panic!("open {dev}: {e}"));
        if dev.starts_with("/tmp/") {
            let _ = std::fs::remove_file(&dev);
        }
        return Some(card);
    }
    None
}

/// A 4 KiB dumb buffer on `card` (its GEM handle) and its PRIME export.
fn dumb_dmabuf(card: &File) -> (u32, OwnedFd, u64) {
    let mut create = DrmModeCreateDumb {
        height: 1,
        width: 1024,
        bpp: 32,
        ..Default::default()
    };
    // SAFETY: a valid drm_mode_create_dumb the kernel reads and fills during the call.
    let rc = unsafe { ioctl(card.as_raw_fd(), DRM_IOCTL_MODE_CREATE_DUMB, &mut create) };
    assert_eq!(
        rc,
        0,
        "DRM_IOCTL_MODE_CREATE_DUMB: {}",
        std::io::Error::last_os_error()
    );
    assert!(create.size >= 4096, "{create:?}");
    let mut prime = DrmPrimeHandle {
        handle: create.handle,
        flags: DRM_CLOEXEC | DRM_RDWR,
        fd: -1,
    };
    // SAFETY: a valid drm_prime_handle the kernel reads and fills during the call.
    let rc = unsafe { ioctl(card.as_raw_fd(), DRM_IOCTL_PRIME_HANDLE_TO_FD, &mut prime) };
    assert_eq!(
        rc,
        0,
        "DRM_IOCTL_PRIME_HANDLE_TO_FD: {}",
        std::io::Error::last_os_error()
    );
    assert!(prime.fd >= 0);
    // SAFETY: the kernel just gave us this descriptor; nothing else owns it.
    (
        create.handle,
        unsafe { OwnedFd::from_raw_fd(prime.fd) },
        create.size,
    )
}

fn destroy_dumb(card: &File, handle: u32) {
    let mut d = DrmModeDestroyDumb { handle };
    // SAFETY: a valid drm_mode_destroy_dumb, read during the call.
    let rc = unsafe { ioctl(card.as_raw_fd(), DRM_IOCTL_MODE_DESTROY_DUMB, &mut d) };
    assert_eq!(
        rc,
        0,
        "DRM_IOCTL_MODE_DESTROY_DUMB: {}",
        std::io::Error::last_os_error()
    );
}

fn is_open(fd: c_int) -> bool {
    std::path::Path::new(&format!("/proc/self/fd/{fd}")).exists()
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Memory regions the kernel lists for this process (`rdma resource show mr`).
fn mr_count() -> usize {
    let out = std::process::Command::new("rdma")
        .args(["resource", "show", "mr"])
        .output()
        .expect("run `rdma resource show mr` (iproute2)");
    let pid = format!("pid {} ", std::process::id());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&pid))
        .count()
}

#[test]
fn a_vgem_dmabuf_is_refused_cleanly_or_registered_and_owned() {
    let test = "a_vgem_dmabuf_is_refused_cleanly_or_registered_and_owned";
    let Some(ctx) = support::open(test) else {
        return;
    };
    let Some(card) = vgem_card() else {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "{test}: no vgem DRM card (/sys/class/drm/card*/device/driver -> vgem) and CI=true; \
             tools/rxe-vm loads the vgem module"
        );
        eprintln!("{test}: SKIPPED: no vgem DRM card (modprobe vgem)");
        return;
    };
    let pd = ctx.alloc_pd().unwrap();
    let (fds0, mrs0) = (open_fds(), mr_count());
    let (handle, dmabuf, size) = dumb_dmabuf(&card);
    let raw = dmabuf.into_raw_fd();
    // SAFETY: we own `raw` (from the export) and give it to rverbs.
    let fd = unsafe { DmabufFd::from_raw_fd(raw) };
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let software = ctx.name().starts_with("rxe") || ctx.name().starts_with("siw");
    match pd.register_dmabuf(fd, 0, size as usize, 0, access) {
        Err(e @ VerbsError::DmabufUnsupported { .. }) => {
            let msg = e.to_string();
            eprintln!("{} refused the vgem dma-buf: {msg}", ctx.name());
            assert!(msg.starts_with("the device does not support dma-buf registration"));
            assert!(
                msg.contains("mlx5"),
                "the error names devices that can: {msg}"
            );
            assert!(
                !is_open(raw),
                "a refused registration closes the descriptor"
            );
            assert_eq!(
                mr_count(),
                mrs0,
                "a refused registration leaves no memory region"
            );
        }
        Err(e) => panic!("{}: unexpected dma-buf refusal: {e}", ctx.name()),
        Ok(region) => {
            assert!(!software, "{} registered dma-buf memory?", ctx.name());
            assert_eq!(region.len(), size as usize);
            assert_eq!(region.remote().addr, 0);
            assert_eq!(region.dmabuf_fd(), raw);
            assert_eq!(mr_count(), mrs0 + 1);
            assert!(
                is_open(raw),
                "the region owns the descriptor while it lives"
            );
            drop(region);
            assert!(
                !is_open(raw),
                "the region closes its descriptor after deregistering"
            );
            assert_eq!(mr_count(), mrs0);
        }
    }
    // Arguments are checked before the call, and the descriptor is closed on that path too.
    let (handle2, dmabuf2, _) = dumb_dmabuf(&card);
    let raw2 = dmabuf2.into_raw_fd();
    // SAFETY: as above.
    let fd2 = unsafe { DmabufFd::from_raw_fd(raw2) };
    assert_eq!(
        pd.register_dmabuf(fd2, u64::MAX, 4096, 0, access)
            .unwrap_err(),
        VerbsError::InvalidArgument {
            what: "dma-buf offset + length overflows"
        }
    );
    assert!(!is_open(raw2));
    destroy_dumb(&card, handle);
    destroy_dumb(&card, handle2);
    assert_eq!(open_fds(), fds0, "no descriptor left behind");
}
