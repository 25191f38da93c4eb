//! The verbs rverbs calls, named once for errors of the device layer ([`crate::verbs`]) and
//! of the provider seam ([`crate::provider`], where the software model names the verb it
//! stands in for), the error a provider call fails with ([`ProviderError`]), and the errno
//! values rverbs itself names ([`errno`]). Below both, so neither imports the other for them.

use core::fmt;

/// A verb, named in errors so a failure says which call failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Verb {
    /// `ibv_get_device_list`
    GetDeviceList,
    /// `ibv_open_device`
    OpenDevice,
    /// `ibv_query_device`
    QueryDevice,
    /// `ibv_query_port`
    QueryPort,
    /// `ibv_query_gid_ex`
    QueryGid,
    /// `ibv_alloc_pd`
    AllocPd,
    /// `ibv_reg_mr`
    RegMr,
    /// `ibv_reg_dmabuf_mr`
    RegDmabufMr,
    /// `ibv_create_cq`
    CreateCq,
    /// `ibv_create_qp`
    CreateQp,
    /// `ibv_modify_qp` to INIT
    ModifyQpInit,
    /// `ibv_modify_qp` to RTR
    ModifyQpRtr,
    /// `ibv_modify_qp` to RTS
    ModifyQpRts,
    /// `ibv_modify_qp` to ERR
    ModifyQpErr,
    /// `ibv_query_qp`
    QueryQp,
    /// `ibv_post_send`
    PostSend,
    /// `ibv_post_recv`
    PostRecv,
    /// `ibv_poll_cq`
    PollCq,
    /// `ibv_create_cq_ex`
    CreateCqEx,
    /// `ibv_query_device_ex`
    QueryDeviceEx,
    /// `ibv_start_poll`
    StartPoll,
    /// `ibv_create_comp_channel`
    CreateCompChannel,
    /// `ibv_req_notify_cq`
    ReqNotifyCq,
    /// `ibv_get_cq_event`
    GetCqEvent,
    /// `ibv_get_async_event` (also: making the context's event descriptor non-blocking)
    GetAsyncEvent,
    /// `ibv_create_srq`
    CreateSrq,
    /// `ibv_modify_srq`
    ModifySrq,
    /// `ibv_post_srq_recv`
    PostSrqRecv,
    /// `ibv_create_ah`
    CreateAh,
    /// `ibv_init_ah_from_wc`
    InitAhFromWc,
    /// `ibv_attach_mcast`
    AttachMcast,
    /// `ibv_detach_mcast`
    DetachMcast,
    /// `setsockopt(IP_ADD_MEMBERSHIP)`: not a verb, but what a RoCE v2 multicast join needs
    /// from the IP stack (see `verbs::mcast`).
    IpAddMembership,
    /// `rdma_join_multicast`: a multicast join through the connection manager (feature
    /// `rdmacm`), named where a provider error stands for it.
    JoinMulticast,
    /// `rdma_leave_multicast`
    LeaveMulticast,
}

impl Verb {
    /// The C name of the verb.
    pub const fn name(self) -> &'static str {
        match self {
            Self::GetDeviceList => "ibv_get_device_list",
            Self::OpenDevice => "ibv_open_device",
            Self::QueryDevice => "ibv_query_device",
            Self::QueryPort => "ibv_query_port",
            Self::QueryGid => "ibv_query_gid_ex",
            Self::AllocPd => "ibv_alloc_pd",
            Self::RegMr => "ibv_reg_mr",
            Self::RegDmabufMr => "ibv_reg_dmabuf_mr",
            Self::CreateCq => "ibv_create_cq",
            Self::CreateQp => "ibv_create_qp",
            Self::ModifyQpInit => "ibv_modify_qp(INIT)",
            Self::ModifyQpRtr => "ibv_modify_qp(RTR)",
            Self::ModifyQpRts => "ibv_modify_qp(RTS)",
            Self::ModifyQpErr => "ibv_modify_qp(ERR)",
            Self::QueryQp => "ibv_query_qp",
            Self::PostSend => "ibv_post_send",
            Self::PostRecv => "ibv_post_recv",
            Self::PollCq => "ibv_poll_cq",
            Self::CreateCqEx => "ibv_create_cq_ex",
            Self::QueryDeviceEx => "ibv_query_device_ex",
            Self::StartPoll => "ibv_start_poll",
            Self::CreateCompChannel => "ibv_create_comp_channel",
            Self::ReqNotifyCq => "ibv_req_notify_cq",
            Self::GetCqEvent => "ibv_get_cq_event",
            Self::GetAsyncEvent => "ibv_get_async_event",
            Self::CreateSrq => "ibv_create_srq",
            Self::ModifySrq => "ibv_modify_srq",
            Self::PostSrqRecv => "ibv_post_srq_recv",
            Self::CreateAh => "ibv_create_ah",
            Self::InitAhFromWc => "ibv_init_ah_from_wc",
            Self::AttachMcast => "ibv_attach_mcast",
            Self::DetachMcast => "ibv_detach_mcast",
            Self::IpAddMembership => "setsockopt(IP_ADD_MEMBERSHIP)",
            Self::JoinMulticast => "rdma_join_multicast",
            Self::LeaveMulticast => "rdma_leave_multicast",
        }
    }
}

/// A failure of a provider call other than a post (polling, state changes): the verb and
/// the errno it reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProviderError {
    /// The verb that failed ([`Verb::PollCq`], [`Verb::ModifyQpErr`], ...).
    pub verb: Verb,
    /// Its errno.
    pub errno: i32,
}

impl fmt::Display for ProviderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed with errno {}", self.verb.name(), self.errno)
    }
}

impl core::error::Error for ProviderError {}

/// The errno values (Linux) rverbs names itself: what it answers with where a driver would,
/// and the answers it tells apart. One place, so every layer means the same number.
pub mod errno {
    /// No such entry (an extended completion queue with nothing to poll).
    pub const ENOENT: i32 = 2;
    /// Interrupted system call.
    pub const EINTR: i32 = 4;
    /// Input/output error (an answer that refused without saying why).
    pub const EIO: i32 = 5;
    /// Try again (a non-blocking descriptor had nothing).
    pub const EAGAIN: i32 = 11;
    /// Out of memory (a full queue, for a post).
    pub const ENOMEM: i32 = 12;
    /// Invalid argument (a request the queue pair cannot take; an error that is not a verb's).
    pub const EINVAL: i32 = 22;
    /// No such function (a provider library without the verb).
    pub const ENOSYS: i32 = 38;
    /// Value too large (a completion queue that overflowed).
    pub const EOVERFLOW: i32 = 75;
    /// Operation not supported (a device without the feature).
    pub const EOPNOTSUPP: i32 = 95;
    /// Address family not supported.
    pub const EAFNOSUPPORT: i32 = 97;
    /// Timed out (an answer that did not come in time).
    pub const ETIMEDOUT: i32 = 110;
    /// Stale handle (an object that was destroyed).
    pub const ESTALE: i32 = 116;
}
