//! The extended send path: queue pairs created with `ibv_create_qp_ex` (asking for the send
//! operations rverbs posts) and posted with `ibv_wr_start`, one `ibv_wr_*` builder and one
//! data setter per request, then `ibv_wr_complete` (ibv_wr_post(3)). Each request goes
//! straight from the caller's typed [`WorkRequest`] into the driver's own work queue entry:
//! one pass, no `ibv_send_wr` in between. Where a provider lacks the entry points, a queue
//! pair posts through the legacy `ibv_send_wr` chain ([`super::send_chain`]) and says why
//! ([`PostPath`]).
//!
//! What `ibv_wr_complete` promises (ibv_wr_post(3)): no request of the critical section is
//! executed until it returns success; a failure detected while building (a bad argument, a
//! full queue: the builders return nothing) makes it return the errno and abort the whole
//! posting. rverbs does not lean on the "nothing was posted" half: rxe's `wr_complete`
//! publishes the requests to its send queue (stores the producer index) before it rings the
//! doorbell with a system call, and returns that call's errno if it fails, when the device
//! may still run every request. A failed complete therefore counts the whole batch posted
//! (the caller flushes and waits before it hands a buffer back), as a legacy failure that
//! names no request does.
//!
//! One more reason to take the legacy chain, per post: a request with more than one
//! scatter/gather entry (or an inline request gathered from several). rxe's
//! `wr_set_sge_list` sums the entries' lengths without advancing through the list and its
//! `wr_set_inline_data_list` never adds them up (rdma-core 55 has both; a fix of the first
//! was posted to linux-rdma in May 2026), so such a request would move the wrong number of
//! bytes. Shown with a C program in the VM (`tools/rxe-proofs/wr_sge_list.c`, Debian's
//! rdma-core 44): a write of two entries of 8 and 4 bytes completes with "local QP operation
//! error" through `ibv_wr_set_sge_list` and writes nothing, and "successfully" writes nothing
//! through `ibv_wr_set_inline_data_list`, where the same requests through `ibv_post_send`
//! write the 12 bytes. Legacy and extended posts may interleave outside each other's critical sections
//! (ibv_wr_post(3)), so the batch is handed to `ibv_post_send` whole instead: the common
//! one-entry request stays on the extended path.

use core::ffi::{c_int, c_void};
use core::fmt;
use core::ptr::{self, NonNull};

use super::ffi::{self, sys, EINVAL};
use super::send_chain::{post_send_chain, SendChain};
use crate::wr::MAX_BATCH;
use crate::wr::{AtomicOp, DatagramRequest, Opcode, PostFailure, SendFlags, WorkRequest};

/// How a queue pair posts its send requests: [`Qp::post_path`](super::Qp::post_path),
/// [`UdQp::post_path`](super::UdQp::post_path) and the instant device's queue pairs say it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PostPath {
    /// `ibv_wr_start`, `ibv_wr_*`, `ibv_wr_complete` (a request of more than one
    /// scatter/gather entry still goes through `ibv_post_send`: see the module docs).
    Extended,
    /// `ibv_post_send` with an `ibv_send_wr` chain, because of the reason given.
    Legacy(LegacyReason),
}

impl PostPath {
    /// Whether posts go through the extended `ibv_wr_*` entry points.
    #[inline]
    pub const fn is_extended(self) -> bool {
        matches!(self, Self::Extended)
    }
}

impl fmt::Display for PostPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Extended => f.write_str("extended verbs (ibv_wr_start/ibv_wr_*/ibv_wr_complete)"),
            Self::Legacy(why) => write!(f, "legacy verbs (ibv_post_send): {why}"),
        }
    }
}

/// Why a queue pair posts through the legacy `ibv_post_send`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LegacyReason {
    /// The device's context has no `create_qp_ex` entry point (not an extended context, or a
    /// provider without it): `ibv_create_qp_ex` would fail with `EOPNOTSUPP`.
    NoCreateQpEx,
    /// `ibv_create_qp_ex` with the send operations rverbs posts failed with this errno
    /// (`EOPNOTSUPP`: the provider does not offer them all), and `ibv_create_qp` succeeded.
    CreateQpEx {
        /// The errno `ibv_create_qp_ex` failed with.
        errno: i32,
    },
    /// `ibv_qp_to_qp_ex` returned no extended queue pair.
    NoQpEx,
    /// The provider left this `ibv_qp_ex` entry point unset.
    MissingOp {
        /// The entry point, as named in `struct ibv_qp_ex`.
        op: &'static str,
    },
}

impl fmt::Display for LegacyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoCreateQpEx => f.write_str("the provider has no ibv_create_qp_ex"),
            Self::CreateQpEx { errno } => write!(
                f,
                "ibv_create_qp_ex with rverbs' send operations failed (errno {errno})"
            ),
            Self::NoQpEx => f.write_str("ibv_qp_to_qp_ex returned no extended queue pair"),
            Self::MissingOp { op } => write!(f, "the provider's queue pair has no {op}"),
        }
    }
}

/// The send operations a connected queue pair asks for (`send_ops_flags`).
pub(crate) const CONNECTED_SEND_OPS: u64 = (sys::IBV_QP_EX_WITH_RDMA_WRITE
    | sys::IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | sys::IBV_QP_EX_WITH_SEND
    | sys::IBV_QP_EX_WITH_SEND_WITH_IMM
    | sys::IBV_QP_EX_WITH_RDMA_READ
    | sys::IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | sys::IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) as u64;

/// The send operations a datagram queue pair asks for.
pub(crate) const DATAGRAM_SEND_OPS: u64 =
    (sys::IBV_QP_EX_WITH_SEND | sys::IBV_QP_EX_WITH_SEND_WITH_IMM) as u64;

/// The end of libibverbs' `struct verbs_context`, which sits right in front of the
/// `ibv_context` a provider hands out: the struct "grows up" (new entry points are added at
/// its start), so these fields keep their distance from the context in every version since
/// `create_qp_ex` was added (rdma-core's `verbs.h`). `sz` is the size of the provider's whole
/// `verbs_context`, which says whether it has a field at all.
#[repr(C)]
struct VerbsContextTail {
    create_qp_ex: Option<
        unsafe extern "C" fn(
            *mut sys::ibv_context,
            *mut sys::ibv_qp_init_attr_ex,
        ) -> *mut sys::ibv_qp,
    >,
    get_srq_num: *mut c_void,
    create_srq_ex: *mut c_void,
    open_xrcd: *mut c_void,
    close_xrcd: *mut c_void,
    abi_placeholder3: u64,
    sz: usize,
}

/// `__VERBS_ABI_IS_EXTENDED`: an `ibv_context` inside a `verbs_context` has this in
/// `abi_compat`.
const ABI_IS_EXTENDED: usize = usize::MAX;

/// A created queue pair and, if it has one, its extended form (or why not).
pub(crate) struct Created {
    pub(crate) raw: NonNull<sys::ibv_qp>,
    pub(crate) ex: Result<NonNull<sys::ibv_qp_ex>, LegacyReason>,
}

/// Creates a queue pair: `ibv_create_qp_ex` with `send_ops` (the operations the queue pair
/// will post) where the provider has it, else `ibv_create_qp` with `init`. Writes the
/// capabilities granted back into `init.cap`. `Err(errno)` of the call that failed last.
///
/// # Safety
/// `pd` is live, and so are the CQs (and SRQ) `init` names.
pub(crate) unsafe fn create_qp(
    pd: *mut sys::ibv_pd,
    init: &mut sys::ibv_qp_init_attr,
    send_ops: u64,
) -> Result<Created, i32> {
    // SAFETY: the caller's contract: pd is live, so is its context.
    let ctx = unsafe { (*pd).context };
    // SAFETY: as above.
    let why = match unsafe { create_qp_ex_entry(ctx) } {
        None => LegacyReason::NoCreateQpEx,
        Some(create) => {
            // SAFETY: plain C data; zero is valid (null pointers, no optional fields).
            let mut ex: sys::ibv_qp_init_attr_ex = unsafe { core::mem::zeroed() };
            ex.qp_context = init.qp_context;
            ex.send_cq = init.send_cq;
            ex.recv_cq = init.recv_cq;
            ex.srq = init.srq;
            ex.cap = init.cap;
            ex.qp_type = init.qp_type;
            ex.sq_sig_all = init.sq_sig_all;
            ex.comp_mask = sys::IBV_QP_INIT_ATTR_PD | sys::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
            ex.pd = pd;
            ex.send_ops_flags = send_ops;
            // SAFETY: the entry point is the provider's, for this context; ex is fully
            // initialised and names live objects (the caller's contract).
            let raw = unsafe { create(ctx, &mut ex) };
            match NonNull::new(raw) {
                Some(raw) => {
                    init.cap = ex.cap;
                    // SAFETY: raw is a live queue pair made by ibv_create_qp_ex.
                    let qpx = unsafe { sys::ibv_qp_to_qp_ex(raw.as_ptr()) };
                    return Ok(Created {
                        raw,
                        ex: NonNull::new(qpx).ok_or(LegacyReason::NoQpEx),
                    });
                }
                None => LegacyReason::CreateQpEx {
                    errno: ffi::errno(),
                },
            }
        }
    };
    // SAFETY: the caller's contract; init is fully initialised.
    let raw = unsafe { sys::ibv_create_qp(pd, init) };
    match NonNull::new(raw) {
        Some(raw) => Ok(Created { raw, ex: Err(why) }),
        None => Err(ffi::errno()),
    }
}

/// The context's `create_qp_ex` (what `verbs_get_ctx_op(ctx, create_qp_ex)` finds), if it
/// is an extended context large enough to have one and the provider set it.
///
/// # Safety
/// `ctx` is a live context opened by libibverbs.
unsafe fn create_qp_ex_entry(
    ctx: *mut sys::ibv_context,
) -> Option<
    unsafe extern "C" fn(*mut sys::ibv_context, *mut sys::ibv_qp_init_attr_ex) -> *mut sys::ibv_qp,
> {
    // SAFETY: ctx is live (the caller's contract).
    if unsafe { (*ctx).abi_compat } as usize != ABI_IS_EXTENDED {
        return None;
    }
    let tail_len = core::mem::size_of::<VerbsContextTail>();
    // SAFETY: an extended context is the last field of a verbs_context, whose tail is the
    // struct above, right in front of it (verbs.h: "sz must be immediately before struct
    // ibv_context"); the allocation holds it.
    let tail = unsafe { &*ctx.cast::<u8>().sub(tail_len).cast::<VerbsContextTail>() };
    if tail.sz < tail_len + core::mem::size_of::<sys::ibv_context>() {
        return None;
    }
    tail.create_qp_ex
}

/// Takes an entry point the extended path needs, or says which one is missing.
fn need<T>(f: Option<T>, op: &'static str) -> Result<T, LegacyReason> {
    f.ok_or(LegacyReason::MissingOp { op })
}

/// Calls the `ibv_qp_ex` entry point `$op` of `$q` as `verbs.h`'s inline `ibv_wr_*` do:
/// loaded from the struct at each call (the provider's functions may change the struct, so
/// the compiler keeps no copies of them across calls), without a check.
///
/// Only inside an `unsafe` block whose SAFETY says the queue pair is live and `$op` was
/// present when it was checked (`WrBase::new` and the types' `new`): providers set the entry
/// points once, when they create the queue pair, and never unset them.
macro_rules! wr_call {
    ($q:expr, $op:ident $(, $arg:expr)*) => {{
        let q: *mut sys::ibv_qp_ex = $q;
        ((*q).$op.unwrap_unchecked())(q $(, $arg)*)
    }};
}

/// An extended queue pair whose entry points every kind posts through (start, complete,
/// abort, send, send with immediate, the entry list and inline data setters) were checked
/// present.
struct WrBase {
    qpx: NonNull<sys::ibv_qp_ex>,
}

impl WrBase {
    /// # Safety
    /// `qpx` is a live extended queue pair.
    unsafe fn new(qpx: NonNull<sys::ibv_qp_ex>) -> Result<Self, LegacyReason> {
        // SAFETY: the caller's contract.
        let q = unsafe { &*qpx.as_ptr() };
        need(q.wr_start, "wr_start")?;
        need(q.wr_complete, "wr_complete")?;
        need(q.wr_abort, "wr_abort")?;
        need(q.wr_send, "wr_send")?;
        need(q.wr_send_imm, "wr_send_imm")?;
        need(q.wr_set_sge_list, "wr_set_sge_list")?;
        need(q.wr_set_inline_data, "wr_set_inline_data")?;
        Ok(Self { qpx })
    }

    /// Sets the id and flags the next builder reads.
    ///
    /// # Safety
    /// Inside a critical section of this live queue pair.
    #[inline(always)]
    unsafe fn header(&self, wr_id: u64, flags: SendFlags) {
        let q = self.qpx.as_ptr();
        // SAFETY: the caller's contract; only this thread is in the critical section.
        unsafe {
            (*q).wr_id = wr_id;
            // The flags are the verbs' own bits (IBV_SEND_*: checked in `wr`'s tests), the
            // inline one included: rxe's kernel half reads an inline payload only when it
            // is set.
            (*q).wr_flags = flags.bits();
        }
    }

    /// Attaches the request's one entry (gathered, or copied when `INLINE`). `false` if it
    /// has more than one: the caller hands the batch to the legacy chain (module docs).
    ///
    /// # Safety
    /// Right after a builder, in a critical section of this live queue pair; the posting
    /// contract for the entry.
    #[inline(always)]
    unsafe fn data(&self, flags: SendFlags, sges: &[crate::sge::Sge<'_>]) -> bool {
        let q = self.qpx.as_ptr();
        // SAFETY: the caller's contract. Sge is #[repr(C)] with the layout of ibv_sge
        // (checked in verbs::mod); an inline entry's bytes are read during the call only.
        unsafe {
            match sges {
                [s] if flags.contains(SendFlags::INLINE) => wr_call!(
                    q,
                    wr_set_inline_data,
                    ptr::with_exposed_provenance_mut(s.addr() as usize),
                    s.len() as usize
                ),
                // No entry (a zero-length request, inline or not) is an empty list.
                [] | [_] => wr_call!(q, wr_set_sge_list, sges.len(), sges.as_ptr().cast()),
                _ => return false,
            }
        }
        true
    }

    /// `ibv_wr_complete`: `Ok` or the whole batch counted posted (module docs).
    ///
    /// # Safety
    /// In a critical section of this live queue pair.
    #[inline(always)]
    unsafe fn complete(&self, n: usize) -> Result<(), PostFailure> {
        // SAFETY: the caller's contract.
        let rc = unsafe { wr_call!(self.qpx.as_ptr(), wr_complete) };
        if rc == 0 {
            Ok(())
        } else {
            Err(complete_failed(rc, n))
        }
    }

    /// `ibv_wr_abort`: nothing of the critical section is posted.
    ///
    /// # Safety
    /// In a critical section of this live queue pair.
    #[cold]
    #[inline(never)]
    unsafe fn abort(&self) {
        // SAFETY: the caller's contract.
        unsafe { wr_call!(self.qpx.as_ptr(), wr_abort) }
    }
}

/// A failed `ibv_wr_complete`, out of the posting path: every request counted posted.
#[cold]
#[inline(never)]
fn complete_failed(rc: c_int, n: usize) -> PostFailure {
    PostFailure {
        posted: n,
        // Providers return a positive errno; a negated one is reported as the errno it is.
        errno: rc.saturating_abs(),
    }
}

/// More requests than one post takes: refused before anything is built.
#[cold]
#[inline(never)]
fn too_many() -> PostFailure {
    PostFailure {
        posted: 0,
        errno: EINVAL,
    }
}

/// A connected extended queue pair whose entry points rverbs posts through were checked
/// present.
pub(crate) struct WrConnected {
    base: WrBase,
}

impl WrConnected {
    /// # Safety
    /// `qpx` is a live extended queue pair, alive as long as the value.
    pub(crate) unsafe fn new(qpx: NonNull<sys::ibv_qp_ex>) -> Result<Self, LegacyReason> {
        // SAFETY: the caller's contract.
        let base = unsafe { WrBase::new(qpx) }?;
        // SAFETY: as above.
        let q = unsafe { &*qpx.as_ptr() };
        need(q.wr_rdma_write, "wr_rdma_write")?;
        need(q.wr_rdma_write_imm, "wr_rdma_write_imm")?;
        need(q.wr_rdma_read, "wr_rdma_read")?;
        need(q.wr_atomic_cmp_swp, "wr_atomic_cmp_swp")?;
        need(q.wr_atomic_fetch_add, "wr_atomic_fetch_add")?;
        Ok(Self { base })
    }

    /// Posts `wrs` in one critical section (one doorbell); `Ok` or what failed. A request of
    /// more than one entry sends the batch to `chain` instead (module docs). At most
    /// [`MAX_BATCH`] requests. Does not allocate.
    ///
    /// # Safety
    /// `qp` is the live queue pair this one extends; the posting contract for the buffers.
    #[inline(always)]
    pub(crate) unsafe fn post(
        &self,
        qp: *mut sys::ibv_qp,
        chain: &mut SendChain,
        wrs: &[WorkRequest<'_>],
    ) -> Result<(), PostFailure> {
        let n = wrs.len();
        if n == 0 {
            return Ok(());
        }
        if n > MAX_BATCH {
            return Err(too_many());
        }
        let b = &self.base;
        let q = b.qpx.as_ptr();
        // SAFETY: the queue pair is live (the caller's contract) and has every entry point
        // called (checked in `new`); the critical section is opened here and closed by
        // complete or abort on every path out; the posting contract is the caller's.
        unsafe {
            wr_call!(q, wr_start);
            for w in wrs {
                b.header(w.wr_id, w.flags);
                let (rkey, addr) = (w.remote.rkey, w.remote.addr);
                match w.opcode {
                    Opcode::Write => wr_call!(q, wr_rdma_write, rkey, addr),
                    Opcode::WriteImm(imm) => {
                        wr_call!(q, wr_rdma_write_imm, rkey, addr, imm.to_be())
                    }
                    Opcode::Send => wr_call!(q, wr_send),
                    Opcode::SendImm(imm) => wr_call!(q, wr_send_imm, imm.to_be()),
                    Opcode::Read => wr_call!(q, wr_rdma_read, rkey, addr),
                    Opcode::Atomic(AtomicOp::CompareSwap { compare, swap }) => {
                        wr_call!(q, wr_atomic_cmp_swp, rkey, addr, compare, swap)
                    }
                    Opcode::Atomic(AtomicOp::FetchAdd(add)) => {
                        wr_call!(q, wr_atomic_fetch_add, rkey, addr, add)
                    }
                }
                if !b.data(w.flags, w.sges) {
                    b.abort();
                    return post_legacy(qp, chain, wrs);
                }
            }
            b.complete(n)
        }
    }
}

/// The legacy chain, for a batch the extended path handed over (module docs).
///
/// # Safety
/// As for [`WrConnected::post`].
#[cold]
#[inline(never)]
unsafe fn post_legacy(
    qp: *mut sys::ibv_qp,
    chain: &mut SendChain,
    wrs: &[WorkRequest<'_>],
) -> Result<(), PostFailure> {
    // SAFETY: forwarded contract.
    unsafe { post_send_chain(qp, chain, wrs) }
}

/// A datagram extended queue pair whose entry points rverbs posts through were checked
/// present.
pub(crate) struct WrDatagram {
    base: WrBase,
}

impl WrDatagram {
    /// # Safety
    /// `qpx` is a live extended queue pair, alive as long as the value.
    pub(crate) unsafe fn new(qpx: NonNull<sys::ibv_qp_ex>) -> Result<Self, LegacyReason> {
        // SAFETY: the caller's contract.
        let base = unsafe { WrBase::new(qpx) }?;
        // SAFETY: as above.
        need(unsafe { (*qpx.as_ptr()).wr_set_ud_addr }, "wr_set_ud_addr")?;
        Ok(Self { base })
    }

    /// Posts datagram sends `wrs` in one critical section, each to the address handle
    /// `ah(dest)`, which `check` may refuse with an errno (then nothing is posted). A
    /// request of more than one entry returns `Err(None)` with nothing posted: the caller
    /// posts the batch through its legacy chain. `FENCE` is dropped (it means nothing for
    /// datagrams). At most [`MAX_BATCH`] requests. Does not allocate.
    ///
    /// # Safety
    /// The queue pair is live; every handle `ah` returns is live for the call; the posting
    /// contract for the buffers.
    #[inline(always)]
    pub(crate) unsafe fn post<A>(
        &self,
        wrs: &[DatagramRequest<'_, A>],
        mut check: impl FnMut(&A) -> Result<*mut sys::ibv_ah, i32>,
    ) -> Result<(), Option<PostFailure>> {
        let n = wrs.len();
        if n == 0 {
            return Ok(());
        }
        if n > MAX_BATCH {
            return Err(Some(too_many()));
        }
        let b = &self.base;
        let q = b.qpx.as_ptr();
        // SAFETY: as in WrConnected::post; the handles are live (the caller's contract).
        unsafe {
            wr_call!(q, wr_start);
            for w in wrs {
                let ah = match check(w.dest) {
                    Ok(ah) => ah,
                    Err(errno) => {
                        b.abort();
                        return Err(Some(PostFailure { posted: 0, errno }));
                    }
                };
                let flags = w.flags & !SendFlags::FENCE;
                b.header(w.wr_id, flags);
                match w.imm {
                    None => wr_call!(q, wr_send),
                    Some(imm) => wr_call!(q, wr_send_imm, imm.to_be()),
                }
                wr_call!(q, wr_set_ud_addr, ah, w.remote_qpn, w.remote_qkey);
                if !b.data(flags, w.sges) {
                    b.abort();
                    return Err(None);
                }
            }
            b.complete(n).map_err(Some)
        }
    }
}

/// The checked extended entry points of one transport ([`WrConnected`], [`WrDatagram`]).
pub(crate) trait ExtendedOps: Sized {
    /// What a sender holding these says of itself in `Debug`.
    const SENDER: &'static str;

    /// # Safety
    /// `qpx` is a live extended queue pair, alive as long as the value.
    unsafe fn open(qpx: NonNull<sys::ibv_qp_ex>) -> Result<Self, LegacyReason>;
}

impl ExtendedOps for WrConnected {
    const SENDER: &'static str = "ConnectedSender";

    unsafe fn open(qpx: NonNull<sys::ibv_qp_ex>) -> Result<Self, LegacyReason> {
        // SAFETY: the caller's contract.
        unsafe { Self::new(qpx) }
    }
}

impl ExtendedOps for WrDatagram {
    const SENDER: &'static str = "DatagramSender";

    unsafe fn open(qpx: NonNull<sys::ibv_qp_ex>) -> Result<Self, LegacyReason> {
        // SAFETY: the caller's contract.
        unsafe { Self::new(qpx) }
    }
}

/// A queue pair's send side: the extended entry points where it has them, and the legacy
/// chain (its only path without them, and the one a batch with a many-entry request takes
/// with them).
pub(crate) struct Sender<W> {
    wr: Result<W, LegacyReason>,
    pub(crate) chain: SendChain,
}

/// A connected queue pair's send side.
pub(crate) type ConnectedSender = Sender<WrConnected>;
/// A datagram queue pair's send side.
pub(crate) type DatagramSender = Sender<WrDatagram>;

impl<W: ExtendedOps> Sender<W> {
    /// The sender of a queue pair whose extended form is `ex` (or why it has none).
    /// Allocates (setup).
    ///
    /// # Safety
    /// An `Ok` `ex` is live as long as the sender.
    pub(crate) unsafe fn new(ex: Result<NonNull<sys::ibv_qp_ex>, LegacyReason>) -> Self {
        Self {
            // SAFETY: the caller's contract.
            wr: ex.and_then(|q| unsafe { W::open(q) }),
            chain: SendChain::new(),
        }
    }

    /// How posts go.
    pub(crate) fn path(&self) -> PostPath {
        match &self.wr {
            Ok(_) => PostPath::Extended,
            Err(why) => PostPath::Legacy(*why),
        }
    }

    /// The extended entry points, if the queue pair has them.
    #[inline(always)]
    pub(crate) fn extended(&self) -> Option<&W> {
        self.wr.as_ref().ok()
    }
}

impl ConnectedSender {
    /// Posts `wrs` to `qp` with one doorbell. At most [`MAX_BATCH`]. Does not allocate.
    ///
    /// # Safety
    /// `qp` is live (and the queue pair the extended entry points belong to); the posting
    /// contract for the buffers.
    #[inline(always)]
    pub(crate) unsafe fn post(
        &mut self,
        qp: *mut sys::ibv_qp,
        wrs: &[WorkRequest<'_>],
    ) -> Result<(), PostFailure> {
        // SAFETY: forwarded contract.
        unsafe {
            match &self.wr {
                Ok(wr) => wr.post(qp, &mut self.chain, wrs),
                Err(_) => post_send_chain(qp, &mut self.chain, wrs),
            }
        }
    }
}

impl<W: ExtendedOps> fmt::Debug for Sender<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(W::SENDER)
            .field("path", &self.path())
            .finish()
    }
}
