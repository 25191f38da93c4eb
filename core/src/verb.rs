//! The verbs rverbs calls, named once for errors of the device layer ([`crate::verbs`]) and
//! of the provider seam ([`crate::provider`], where the software model names the verb it
//! stands in for). Below both, so neither imports the other for it.

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
