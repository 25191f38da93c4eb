//! Devices, device contexts, port attributes and the GID table.

use alloc::sync::Arc;
use core::ffi::CStr;
use core::fmt;
use core::marker::PhantomData;
use core::mem::MaybeUninit;
use core::ptr::NonNull;

use super::destroy::Owned;
use super::error::{Result, Verb, VerbsError};
use super::ffi::{errno, sys};
pub use crate::gid::Gid;
use crate::params::Mtu;

/// The RDMA devices present on this host (`ibv_get_device_list`).
pub struct DeviceList {
    list: NonNull<*mut sys::ibv_device>,
    len: usize,
}

// SAFETY: the list is an immutable array of device pointers owned by this value; libibverbs
// allows using it from any thread.
unsafe impl Send for DeviceList {}
// SAFETY: only read after construction.
unsafe impl Sync for DeviceList {}

impl DeviceList {
    /// Lists the devices. An empty list is not an error.
    pub fn new() -> Result<Self> {
        let mut n: core::ffi::c_int = 0;
        // SAFETY: n is a valid out-pointer; the returned array is freed in Drop.
        let list = unsafe { sys::ibv_get_device_list(&mut n) };
        let list = NonNull::new(list).ok_or(VerbsError::Call {
            verb: Verb::GetDeviceList,
            errno: errno(),
        })?;
        Ok(Self {
            list,
            len: usize::try_from(n).unwrap_or(0),
        })
    }

    /// Number of devices.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no devices.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The devices, in the order libibverbs lists them.
    pub fn iter(&self) -> impl Iterator<Item = Device<'_>> + '_ {
        (0..self.len).map(move |i| {
            // SAFETY: i < len, and the array holds len valid device pointers.
            let raw = unsafe { *self.list.as_ptr().add(i) };
            Device {
                raw,
                _list: PhantomData,
            }
        })
    }

    /// The device called `name` (for example `rxe0` or `mlx5_0`).
    pub fn find(&self, name: &str) -> Option<Device<'_>> {
        self.iter().find(|d| d.name() == name)
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: list came from ibv_get_device_list and is freed once. Opened contexts stay
        // valid after the list is freed (ibv_open_device(3)).
        unsafe { sys::ibv_free_device_list(self.list.as_ptr()) }
    }
}

impl fmt::Debug for DeviceList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// One device of a [`DeviceList`].
#[derive(Clone, Copy)]
pub struct Device<'a> {
    raw: *mut sys::ibv_device,
    _list: PhantomData<&'a DeviceList>,
}

impl<'a> Device<'a> {
    /// The kernel name of the device.
    pub fn name(&self) -> &'a str {
        // SAFETY: raw is a live device of the list borrowed for 'a; the name is a
        // NUL-terminated string owned by it.
        let name = unsafe { CStr::from_ptr(sys::ibv_get_device_name(self.raw)) };
        name.to_str().unwrap_or("<non-utf8>")
    }

    /// Opens the device.
    pub fn open(&self) -> Result<Context> {
        // SAFETY: raw is a live device pointer. Every child (PD, CQ, QP, MR) holds an Arc to
        // the `ContextInner` that owns the context, so none is alive when it is closed.
        let raw = unsafe { Owned::create(sys::ibv_open_device(self.raw), Verb::OpenDevice) }?;
        Ok(Context {
            inner: Arc::new(ContextInner { raw }),
        })
    }
}

impl fmt::Debug for Device<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Device").field(&self.name()).finish()
    }
}

/// Opens the device called `name`.
pub fn open_device(name: &str) -> Result<Context> {
    DeviceList::new()?
        .find(name)
        .ok_or(VerbsError::NoSuchDevice)?
        .open()
}

pub(crate) struct ContextInner {
    pub(crate) raw: Owned<sys::ibv_context>,
}

/// An open device (`ibv_context`). Cheap to clone; closed when the last clone and every
/// resource made from it are gone.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.name())
            .finish()
    }
}

impl Context {
    /// The raw `ibv_context`, for verbs rverbs does not wrap. It stays valid while `self` lives.
    pub fn as_raw(&self) -> *mut sys::ibv_context {
        self.inner.raw.as_ptr()
    }

    /// The device's kernel name.
    pub fn name(&self) -> &str {
        // SAFETY: the context's device pointer is valid while the context is open.
        unsafe {
            let dev = (*self.as_raw()).device;
            CStr::from_ptr(sys::ibv_get_device_name(dev))
                .to_str()
                .unwrap_or("<non-utf8>")
        }
    }

    /// Device attributes (`ibv_query_device`).
    pub fn query_device(&self) -> Result<DeviceAttr> {
        let mut attr = MaybeUninit::<sys::ibv_device_attr>::zeroed();
        // SAFETY: the context is open and attr is a valid out-pointer.
        let rc = unsafe { sys::ibv_query_device(self.as_raw(), attr.as_mut_ptr()) };
        if rc != 0 {
            return Err(VerbsError::Call {
                verb: Verb::QueryDevice,
                errno: rc,
            });
        }
        // SAFETY: zero is a valid bit pattern for this plain C struct, and the verb filled it.
        let a = unsafe { attr.assume_init() };
        Ok(DeviceAttr {
            max_qp_wr: u32::try_from(a.max_qp_wr).unwrap_or(0),
            max_sge: u32::try_from(a.max_sge).unwrap_or(0),
            max_cqe: u32::try_from(a.max_cqe).unwrap_or(0),
            max_mr_size: a.max_mr_size,
            max_qp_rd_atom: u32::try_from(a.max_qp_rd_atom).unwrap_or(0),
            max_qp_init_rd_atom: u32::try_from(a.max_qp_init_rd_atom).unwrap_or(0),
            phys_port_cnt: a.phys_port_cnt,
            node_guid: u64::from_be(a.node_guid),
            max_srq: u32::try_from(a.max_srq).unwrap_or(0),
            max_srq_wr: u32::try_from(a.max_srq_wr).unwrap_or(0),
            max_srq_sge: u32::try_from(a.max_srq_sge).unwrap_or(0),
        })
    }

    /// Port attributes (`ibv_query_port`). Ports are numbered from 1.
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        let mut attr = MaybeUninit::<sys::ibv_port_attr>::zeroed();
        // SAFETY: the exported ibv_query_port takes the older, shorter `_compat_ibv_port_attr`
        // and fills only that prefix; a zeroed full-size struct is a valid, larger target.
        let rc = unsafe { sys::ibv_query_port(self.as_raw(), port, attr.as_mut_ptr().cast()) };
        if rc != 0 {
            return Err(if rc == 22 {
                VerbsError::NoSuchPort { port }
            } else {
                VerbsError::Call {
                    verb: Verb::QueryPort,
                    errno: rc,
                }
            });
        }
        // SAFETY: zeroed then filled by the verb; plain C data.
        let a = unsafe { attr.assume_init() };
        Ok(PortAttr {
            port,
            state: a.state,
            active: a.state == sys::ibv_port_state::IBV_PORT_ACTIVE,
            max_mtu: Mtu::from_code(a.max_mtu as u8).unwrap_or(Mtu::B256),
            active_mtu: Mtu::from_code(a.active_mtu as u8).unwrap_or(Mtu::B256),
            lid: a.lid,
            link_layer: match u32::from(a.link_layer) {
                sys::IBV_LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
                _ => LinkLayer::InfiniBand,
            },
            gid_table_len: u32::try_from(a.gid_tbl_len).unwrap_or(0),
            max_msg_size: a.max_msg_sz,
        })
    }

    /// One GID table entry with its type (`ibv_query_gid_ex`), or `None` if the slot is empty.
    pub fn gid_entry(&self, port: u8, index: u32) -> Result<Option<GidEntry>> {
        let mut e = MaybeUninit::<sys::ibv_gid_entry>::zeroed();
        // SAFETY: the context is open; e is a valid out-pointer of the size we pass.
        let rc = unsafe {
            sys::_ibv_query_gid_ex(
                self.as_raw(),
                u32::from(port),
                index,
                e.as_mut_ptr(),
                0,
                core::mem::size_of::<sys::ibv_gid_entry>(),
            )
        };
        match rc {
            0 => {}
            // Unpopulated slots answer ENODATA (61) or EINVAL on older kernels.
            61 | 22 => return Ok(None),
            _ => {
                return Err(VerbsError::Call {
                    verb: Verb::QueryGid,
                    errno: rc,
                })
            }
        }
        // SAFETY: zeroed then filled; plain C data.
        let e = unsafe { e.assume_init() };
        // SAFETY: ibv_gid is a union of a 16-byte array and two u64; every bit pattern is a
        // valid byte array.
        let gid = Gid(unsafe { e.gid.raw });
        if gid.is_zero() {
            return Ok(None);
        }
        Ok(Some(GidEntry {
            gid,
            index,
            kind: match e.gid_type {
                sys::IBV_GID_TYPE_ROCE_V1 => GidType::RoceV1,
                sys::IBV_GID_TYPE_ROCE_V2 => GidType::RoceV2,
                _ => GidType::Ib,
            },
        }))
    }

    /// The populated GID table entries of a port, in index order.
    pub fn gid_table(&self, port: u8) -> Result<GidTable<'_>> {
        let len = self.query_port(port)?.gid_table_len;
        Ok(GidTable {
            ctx: self,
            port,
            next: 0,
            len,
        })
    }

    /// The route for a port: the GID at `gid_index` (routed by GID), or
    /// [`Context::default_route`] when `None`.
    pub fn route(&self, port: u8, gid_index: Option<u8>) -> Result<Route> {
        let Some(i) = gid_index else {
            return self.default_route(port);
        };
        let e = self
            .gid_entry(port, u32::from(i))?
            .ok_or(VerbsError::InvalidArgument {
                what: "the chosen GID index is empty",
            })?;
        Ok(Route {
            gid_index: i,
            gid: e.gid,
            global: true,
        })
    }

    /// The routing choice for a port: on Ethernet (RoCE) ports, a RoCE v2 GID that maps an
    /// IPv4 address (else any RoCE v2, else any GID); on InfiniBand ports, LID routing with
    /// GID index 0 kept for the endpoint.
    pub fn default_route(&self, port: u8) -> Result<Route> {
        let attr = self.query_port(port)?;
        if attr.link_layer == LinkLayer::InfiniBand {
            let gid = self.gid_entry(port, 0)?.map(|e| e.gid).unwrap_or_default();
            return Ok(Route {
                gid_index: 0,
                gid,
                global: false,
            });
        }
        let mut best: Option<(u8, GidEntry)> = None;
        for entry in self.gid_table(port)? {
            let entry = entry?;
            let rank = match (entry.kind, entry.gid.is_ipv4_mapped()) {
                (GidType::RoceV2, true) => 3,
                (GidType::RoceV2, false) => 2,
                _ => 1,
            };
            if best.as_ref().is_none_or(|(r, _)| rank > *r) {
                best = Some((rank, entry));
            }
        }
        let (_, e) = best.ok_or(VerbsError::NoUsableGid { port })?;
        Ok(Route {
            gid_index: u8::try_from(e.index).map_err(|_| VerbsError::NoUsableGid { port })?,
            gid: e.gid,
            global: true,
        })
    }
}

/// Iterator over the populated entries of a port's GID table.
#[derive(Debug)]
pub struct GidTable<'a> {
    ctx: &'a Context,
    port: u8,
    next: u32,
    len: u32,
}

impl Iterator for GidTable<'_> {
    type Item = Result<GidEntry>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.next < self.len {
            let i = self.next;
            self.next += 1;
            match self.ctx.gid_entry(self.port, i) {
                Ok(None) => continue,
                Ok(Some(e)) => return Some(Ok(e)),
                Err(e) => return Some(Err(e)),
            }
        }
        None
    }
}

/// Device attributes rverbs uses to size queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceAttr {
    /// Most work requests in one queue.
    pub max_qp_wr: u32,
    /// Most scatter/gather entries per work request.
    pub max_sge: u32,
    /// Most entries in one completion queue.
    pub max_cqe: u32,
    /// Largest memory region.
    pub max_mr_size: u64,
    /// Most outstanding RDMA reads/atomics a QP can accept as responder.
    pub max_qp_rd_atom: u32,
    /// Most outstanding RDMA reads/atomics a QP can issue.
    pub max_qp_init_rd_atom: u32,
    /// Number of ports.
    pub phys_port_cnt: u8,
    /// Node GUID (host byte order).
    pub node_guid: u64,
    /// Most shared receive queues (0: the device has none).
    pub max_srq: u32,
    /// Most work requests in one shared receive queue.
    pub max_srq_wr: u32,
    /// Most scatter/gather entries per shared-receive-queue request.
    pub max_srq_sge: u32,
}

/// Link layer of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// InfiniBand: routed by LID inside a subnet.
    InfiniBand,
    /// Ethernet (RoCE): routed by GID, always with a global route header.
    Ethernet,
}

/// Port attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortAttr {
    /// Port number (from 1).
    pub port: u8,
    /// The raw `ibv_port_state`.
    pub state: u32,
    /// Whether the port is ACTIVE.
    pub active: bool,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU currently active on the link: the right default for the path MTU.
    pub active_mtu: Mtu,
    /// Local identifier (InfiniBand).
    pub lid: u16,
    /// InfiniBand or Ethernet.
    pub link_layer: LinkLayer,
    /// Size of the GID table.
    pub gid_table_len: u32,
    /// Largest message.
    pub max_msg_size: u32,
}

/// The kind of a GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GidType {
    /// InfiniBand.
    Ib,
    /// RoCE v1 (Ethernet frames, not routable over IP).
    RoceV1,
    /// RoCE v2 (UDP/IP, routable).
    RoceV2,
}

/// A populated GID table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidEntry {
    /// The GID.
    pub gid: Gid,
    /// Its index in the table.
    pub index: u32,
    /// Its kind.
    pub kind: GidType,
}

/// How a QP on a port is addressed: which GID index and whether the global route header
/// is used (always on RoCE; off on InfiniBand inside one subnet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// Source GID index.
    pub gid_index: u8,
    /// The GID at that index.
    pub gid: Gid,
    /// Whether to route by GID (`is_global = 1`).
    pub global: bool,
}
