//! The extended verbs of a context that `verbs.h` implements `static inline` over
//! `struct verbs_context`, which ibverbs-sys does not bind: `ibv_create_cq_ex` and
//! `ibv_query_device_ex`.
//!
//! A provider built on rdma-core allocates a `struct verbs_context` whose last field is the
//! `ibv_context` every verb receives, marks it with `abi_compat == UINTPTR_MAX`, and records
//! in `sz` how large its `verbs_context` is: the table grows at its front, so an operation
//! exists only if `sz` reaches back far enough to hold it (what `verbs_get_ctx_op` checks).
//! [`VerbsContextTail`] mirrors the part of the table from `query_rt_values` to the context,
//! which has not changed since rdma-core 13; its size is checked against the C layout below.

use core::ffi::{c_int, c_void};
use core::mem::{offset_of, size_of};

use super::ffi::sys;

/// `verbs_context` from `query_rt_values` to `sz` (the fields rverbs reads are typed; the
/// rest are placeholders of their size, pointers all).
#[repr(C)]
struct VerbsContextTail {
    query_rt_values: *const c_void,
    create_cq_ex: Option<
        unsafe extern "C" fn(
            *mut sys::ibv_context,
            *mut sys::ibv_cq_init_attr_ex,
        ) -> *mut sys::ibv_cq_ex,
    >,
    priv_: *mut c_void,
    query_device_ex: Option<
        unsafe extern "C" fn(
            *mut sys::ibv_context,
            *const sys::ibv_query_device_ex_input,
            *mut sys::ibv_device_attr_ex,
            usize,
        ) -> c_int,
    >,
    /// `ibv_destroy_flow` .. `close_xrcd`: ten function pointers.
    _later: [*const c_void; 10],
    _abi_placeholder3: u64,
    sz: usize,
}

/// `__VERBS_ABI_IS_EXTENDED`: what `abi_compat` holds in a context that is a `verbs_context`.
const ABI_IS_EXTENDED: usize = usize::MAX;

/// In `struct verbs_context`, the bytes from `create_cq_ex` to the end: the `sz` a provider
/// must report for it to have the operation. The C struct ends with the `ibv_context`.
const fn needed(offset_in_tail: usize) -> usize {
    size_of::<VerbsContextTail>() - offset_in_tail + size_of::<sys::ibv_context>()
}

/// The tail of the context's `verbs_context`, or null for a context that is not one.
///
/// # Safety
/// `ctx` is a live context.
unsafe fn tail(ctx: *mut sys::ibv_context) -> *const VerbsContextTail {
    // SAFETY: the caller keeps the context live; abi_compat is one of its fields.
    if unsafe { (*ctx).abi_compat } as usize != ABI_IS_EXTENDED {
        return core::ptr::null();
    }
    // The marker says the context is the last field of a verbs_context, so the tail sits
    // right in front of it (the wrapping arithmetic never dereferences).
    ctx.cast::<u8>()
        .wrapping_sub(size_of::<VerbsContextTail>())
        .cast()
}

/// Reads the op at `offset` of the tail if the provider's table is large enough to hold it.
///
/// # Safety
/// `ctx` is a live context; `read` reads that field.
unsafe fn op<T>(
    ctx: *mut sys::ibv_context,
    offset: usize,
    read: impl FnOnce(&VerbsContextTail) -> Option<T>,
) -> Option<T> {
    // SAFETY: forwarded.
    let t = unsafe { tail(ctx) };
    if t.is_null() {
        return None;
    }
    // SAFETY: `sz` is the field right in front of the context, present in every
    // verbs_context; the fields in front of it are read only when `sz` says the provider's
    // table has them (as verbs_get_ctx_op checks).
    unsafe {
        if (*t).sz < needed(offset) {
            return None;
        }
        read(&*t)
    }
}

/// `ibv_create_cq_ex`: the CQ, or `Err(errno)` (`EOPNOTSUPP` from a provider without it).
///
/// # Safety
/// `ctx` is a live context; `attr`'s channel, if any, belongs to it.
pub(crate) unsafe fn create_cq_ex(
    ctx: *mut sys::ibv_context,
    attr: &mut sys::ibv_cq_init_attr_ex,
) -> Result<core::ptr::NonNull<sys::ibv_cq_ex>, i32> {
    // SAFETY: forwarded; the closure reads the field named by the offset.
    let f = unsafe {
        op(ctx, offset_of!(VerbsContextTail, create_cq_ex), |t| {
            t.create_cq_ex
        })
    };
    let Some(f) = f else {
        return Err(crate::verb::errno::EOPNOTSUPP);
    };
    // SAFETY: the provider's own operation, called as verbs.h calls it.
    let cq = unsafe { f(ctx, attr) };
    core::ptr::NonNull::new(cq).ok_or_else(super::ffi::errno)
}

/// `ibv_query_device_ex` without input: the extended attributes, or `Err(errno)`.
///
/// # Safety
/// `ctx` is a live context.
pub(crate) unsafe fn query_device_ex(
    ctx: *mut sys::ibv_context,
) -> Result<sys::ibv_device_attr_ex, i32> {
    // SAFETY: forwarded; the closure reads the field named by the offset.
    let f = unsafe {
        op(ctx, offset_of!(VerbsContextTail, query_device_ex), |t| {
            t.query_device_ex
        })
    };
    let Some(f) = f else {
        return Err(crate::verb::errno::EOPNOTSUPP);
    };
    // SAFETY: zero is valid for this plain C struct.
    let mut attr: sys::ibv_device_attr_ex = unsafe { core::mem::zeroed() };
    // SAFETY: the provider's own operation with a valid out-pointer and its size, as verbs.h
    // calls it (a null input asks for nothing special).
    let rc = unsafe {
        f(
            ctx,
            core::ptr::null(),
            &mut attr,
            size_of::<sys::ibv_device_attr_ex>(),
        )
    };
    if rc != 0 {
        return Err(rc);
    }
    Ok(attr)
}

// `verbs_context` of verbs.h on a 64-bit target: 38 pointers and a u64 in front of `sz`;
// `query_rt_values` is the 25th field (index 24), so the tail holds the last 16 of them.
const _: () = assert!(size_of::<VerbsContextTail>() == 16 * 8);
const _: () = assert!(offset_of!(VerbsContextTail, sz) == 15 * 8);

#[cfg(test)]
mod tests {
    use super::*;

    /// A context that is a `verbs_context` whose provider filled `sz` as given.
    #[repr(C)]
    struct Fake {
        tail: VerbsContextTail,
        ctx: sys::ibv_context,
    }

    unsafe extern "C" fn fake_create(
        _ctx: *mut sys::ibv_context,
        attr: *mut sys::ibv_cq_init_attr_ex,
    ) -> *mut sys::ibv_cq_ex {
        // SAFETY: the test passes a valid attr.
        unsafe { (*attr).cqe = 99 };
        core::ptr::null_mut()
    }

    fn fake(sz: usize, extended: bool) -> alloc::boxed::Box<Fake> {
        // SAFETY: all-zero is valid for these plain C structs (null pointers, no functions).
        let mut f: alloc::boxed::Box<Fake> = alloc::boxed::Box::new(unsafe { core::mem::zeroed() });
        f.tail.create_cq_ex = Some(fake_create);
        f.tail.sz = sz;
        if extended {
            f.ctx.abi_compat = usize::MAX as *mut c_void;
        }
        f
    }

    #[test]
    fn an_op_is_called_only_where_the_table_reaches_it() {
        let full = size_of::<Fake>();
        let mut attr: sys::ibv_cq_init_attr_ex =
            // SAFETY: all-zero is valid for this plain C struct.
            unsafe { core::mem::zeroed() };
        for (sz, extended, called) in [
            (full, true, true),
            (
                needed(offset_of!(VerbsContextTail, create_cq_ex)),
                true,
                true,
            ),
            (
                needed(offset_of!(VerbsContextTail, create_cq_ex)) - 1,
                true,
                false,
            ),
            (full, false, false),
        ] {
            let mut f = fake(sz, extended);
            attr.cqe = 0;
            // SAFETY: the fake context is live for the call.
            let r = unsafe { create_cq_ex(&mut f.ctx, &mut attr) };
            assert!(r.is_err());
            assert_eq!(attr.cqe == 99, called, "sz {sz}, extended {extended}");
            if !called {
                assert_eq!(r, Err(crate::verb::errno::EOPNOTSUPP));
            }
            // No query_device_ex in the fake table: refused, never called through null.
            // SAFETY: as above.
            let q = unsafe { query_device_ex(&mut f.ctx) };
            assert_eq!(q.err(), Some(crate::verb::errno::EOPNOTSUPP));
        }
    }
}
