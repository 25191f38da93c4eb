//! The one place that calls libpmix: the generated bindings and a safe [`Client`] over the
//! seven calls the rendezvous needs (init, put, commit, fence, get, finalize, error string).
//!
//! Ownership rules these wrappers rely on, from the PMIx standard and OpenPMIx 4.2:
//! `PMIx_Put` copies the value it is given, so the caller's bytes may go once it returns;
//! `PMIx_Get` hands back a `malloc`ed `pmix_value_t` the caller releases with
//! `PMIx_Value_destruct` (the data it points to) and `free` (the struct), which is what the
//! header's `PMIX_VALUE_RELEASE` macro does; info arrays are read during the call only.
#![allow(unsafe_code)]

use core::ffi::{c_char, c_void, CStr};
use core::fmt;
use core::mem::MaybeUninit;
use core::ptr;

#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    unreachable_pub,
    missing_docs,
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    clippy::std_instead_of_core
)]
mod sys {
    include!(concat!(env!("OUT_DIR"), "/pmix_bindings.rs"));
}

/// `PMIX_RANK_WILDCARD` (`UINT32_MAX-1` in the header, which bindgen does not evaluate):
/// "every rank of the namespace", where job-level values such as the job size live.
const RANK_WILDCARD: u32 = u32::MAX - 1;

/// A PMIx status code that is not `PMIX_SUCCESS`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Status(pub(crate) i32);

impl Status {
    pub(crate) const TIMEOUT: Self = Self(sys::PMIX_ERR_TIMEOUT);
    pub(crate) const NOT_FOUND: Self = Self(sys::PMIX_ERR_NOT_FOUND);

    fn check(code: sys::pmix_status_t) -> Result<(), Self> {
        if code == sys::PMIX_SUCCESS as sys::pmix_status_t {
            Ok(())
        } else {
            Err(Self(code))
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // SAFETY: PMIx_Error_string takes any status value and returns a pointer to a static
        // NUL-terminated string (or NULL, handled below); it needs no initialized library.
        let text = unsafe { sys::PMIx_Error_string(self.0) };
        if text.is_null() {
            return write!(f, "PMIx status {}", self.0);
        }
        // SAFETY: non-null, static and NUL-terminated, as above.
        let text = unsafe { CStr::from_ptr(text) };
        write!(f, "{} ({})", text.to_string_lossy(), self.0)
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The version string of the linked libpmix, e.g. "OpenPMIx 4.2.2rc2 ...".
pub(crate) fn library_version() -> String {
    // SAFETY: PMIx_Get_version returns a pointer to a static NUL-terminated string and may be
    // called before PMIx_Init.
    let text = unsafe { sys::PMIx_Get_version() };
    if text.is_null() {
        return "unknown".to_owned();
    }
    // SAFETY: non-null, static and NUL-terminated, as above.
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

/// An initialized PMIx client: this process's namespace and rank. Dropping it calls
/// `PMIx_Finalize` (libpmix counts initializations, so a program that also calls `PMIx_Init`
/// itself, such as an MPI library, keeps its own).
pub(crate) struct Client {
    /// Boxed: 260 bytes that every get copies anyway, and the sessions that hold a client
    /// stay small.
    me: Box<sys::pmix_proc_t>,
}

// SAFETY: the client state lives in libpmix, whose client API is thread safe (every call is
// handed to the library's progress thread); `me` is plain bytes.
unsafe impl Send for Client {}
// SAFETY: as above; `&Client` only reads `me` and makes thread-safe library calls.
unsafe impl Sync for Client {}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("namespace", &self.namespace())
            .field("rank", &self.rank())
            .finish()
    }
}

/// An info array entry with a scalar value: nothing in it owns memory, so dropping it
/// without `PMIx_Info_destruct` leaks nothing.
fn info_int(key: &[u8], value: i32) -> sys::pmix_info_t {
    load_info(key, (&raw const value).cast(), sys::PMIX_INT)
}

fn info_bool(key: &[u8], value: bool) -> sys::pmix_info_t {
    load_info(key, (&raw const value).cast(), sys::PMIX_BOOL)
}

fn load_info(key: &[u8], data: *const c_void, kind: u32) -> sys::pmix_info_t {
    let key = CStr::from_bytes_with_nul(key).expect("bindgen emits NUL-terminated keys");
    let mut info = MaybeUninit::<sys::pmix_info_t>::zeroed();
    // SAFETY: `info` is writable and zeroed (a valid empty info); `key` is NUL-terminated and
    // shorter than PMIX_MAX_KEYLEN; `data` points to a live value of the C type `kind` names
    // (int or bool, which Rust's i32 and bool match), copied during the call.
    let status = unsafe {
        sys::PMIx_Info_load(
            info.as_mut_ptr(),
            key.as_ptr(),
            data,
            kind as sys::pmix_data_type_t,
        )
    };
    debug_assert_eq!(status, sys::PMIX_SUCCESS as sys::pmix_status_t);
    // SAFETY: zeroed is already a valid pmix_info_t; PMIx_Info_load filled it in.
    unsafe { info.assume_init() }
}

/// A value returned by `PMIx_Get`, released on drop.
struct Value(*mut sys::pmix_value_t);

impl Drop for Value {
    fn drop(&mut self) {
        // SAFETY: the pointer came from a successful PMIx_Get and is released once, the way
        // PMIX_VALUE_RELEASE does: destruct the data, then free the malloc'ed struct.
        unsafe {
            sys::PMIx_Value_destruct(self.0);
            libc::free(self.0.cast());
        }
    }
}

impl Client {
    /// `PMIx_Init`: connects to the local PMIx server named by the environment the launcher
    /// set (`PMIX_SERVER_URI*`, `PMIX_NAMESPACE`, `PMIX_RANK`).
    pub(crate) fn init() -> Result<Self, Status> {
        let mut me = MaybeUninit::<sys::pmix_proc_t>::zeroed();
        // SAFETY: `me` is writable storage for one pmix_proc_t, which PMIx_Init fills in;
        // no info array is passed.
        Status::check(unsafe { sys::PMIx_Init(me.as_mut_ptr(), ptr::null_mut(), 0) })?;
        // SAFETY: zeroed is a valid pmix_proc_t, and PMIx_Init succeeded and filled it in.
        let me = unsafe { me.assume_init() };
        Ok(Self { me: Box::new(me) })
    }

    /// This process's rank in its namespace.
    pub(crate) fn rank(&self) -> u32 {
        self.me.rank
    }

    /// This process's namespace (the job), as the launcher named it.
    pub(crate) fn namespace(&self) -> String {
        let bytes: Vec<u8> = self
            .me
            .nspace
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// `PMIx_Put` of `bytes` as a byte object under `key`, global scope.
    pub(crate) fn put(&self, key: &CStr, bytes: &[u8]) -> Result<(), Status> {
        // SAFETY: zeroed is a valid empty value; the fields set below are those of a byte
        // object.
        let mut value: sys::pmix_value_t = unsafe { MaybeUninit::zeroed().assume_init() };
        value.type_ = sys::PMIX_BYTE_OBJECT as sys::pmix_data_type_t;
        value.data.bo = sys::pmix_byte_object_t {
            bytes: bytes.as_ptr().cast::<c_char>().cast_mut(),
            size: bytes.len(),
        };
        // SAFETY: `key` is NUL-terminated; `value` describes `bytes`, which outlive the call;
        // PMIx_Put copies the value and never writes through the pointer, so the const-cast
        // above is never used to mutate.
        Status::check(unsafe {
            sys::PMIx_Put(
                sys::PMIX_GLOBAL as sys::pmix_scope_t,
                key.as_ptr(),
                &raw mut value,
            )
        })
    }

    /// `PMIx_Commit`: hands the puts so far to the local server.
    pub(crate) fn commit(&self) -> Result<(), Status> {
        // SAFETY: no arguments; only valid after init, which `self` proves.
        Status::check(unsafe { sys::PMIx_Commit() })
    }

    /// `PMIx_Fence` over every rank of the namespace, collecting the committed data, giving
    /// up after `timeout_secs` (0 would mean never; callers pass at least 1).
    pub(crate) fn fence(&self, timeout_secs: i32) -> Result<(), Status> {
        let info = [
            info_bool(sys::PMIX_COLLECT_DATA, true),
            info_int(sys::PMIX_TIMEOUT, timeout_secs),
        ];
        // SAFETY: a null proc array with length 0 means "all of my namespace"; `info` is a
        // valid array of `info.len()` entries that lives across the call.
        Status::check(unsafe { sys::PMIx_Fence(ptr::null(), 0, info.as_ptr(), info.len()) })
    }

    fn get(&self, rank: u32, key: &CStr, timeout_secs: Option<i32>) -> Result<Value, Status> {
        let mut proc_ = *self.me;
        proc_.rank = rank;
        let info: Vec<sys::pmix_info_t> = timeout_secs
            .map(|secs| info_int(sys::PMIX_TIMEOUT, secs))
            .into_iter()
            .collect();
        let mut out: *mut sys::pmix_value_t = ptr::null_mut();
        // SAFETY: `proc_` is a valid proc in our namespace, `key` NUL-terminated, `info` a
        // valid array (or empty, passed as a dangling-but-unread pointer with length 0), and
        // `out` a writable pointer slot that PMIx_Get fills on success.
        let status = unsafe {
            sys::PMIx_Get(
                &raw const proc_,
                key.as_ptr(),
                info.as_ptr(),
                info.len(),
                &raw mut out,
            )
        };
        Status::check(status)?;
        if out.is_null() {
            return Err(Status::NOT_FOUND);
        }
        Ok(Value(out))
    }

    /// `PMIx_Get` of a byte object that `rank` put under `key`; `Ok(None)` when the value
    /// has another type.
    pub(crate) fn get_bytes(
        &self,
        rank: u32,
        key: &CStr,
        timeout_secs: i32,
    ) -> Result<Option<Vec<u8>>, Status> {
        let value = self.get(rank, key, Some(timeout_secs))?;
        // SAFETY: `value.0` is a valid value returned by PMIx_Get, alive until `value` drops.
        let v = unsafe { &*value.0 };
        if u32::from(v.type_) != sys::PMIX_BYTE_OBJECT {
            return Ok(None);
        }
        // SAFETY: the type says the union holds a byte object.
        let bo = unsafe { v.data.bo };
        if bo.bytes.is_null() || bo.size == 0 {
            return Ok(Some(Vec::new()));
        }
        // SAFETY: a byte object from PMIx_Get owns `size` readable bytes at `bytes`, valid
        // until the value is destructed when `value` drops after this copy.
        let bytes = unsafe { core::slice::from_raw_parts(bo.bytes.cast::<u8>(), bo.size) };
        Ok(Some(bytes.to_vec()))
    }

    /// `PMIx_Get` of an unsigned job-level (`rank: None`, the wildcard rank) or own value
    /// such as the job size or the local rank; `Ok(None)` for a value of another type.
    pub(crate) fn get_uint(&self, rank: Option<u32>, key: &[u8]) -> Result<Option<u32>, Status> {
        let key = CStr::from_bytes_with_nul(key).expect("bindgen emits NUL-terminated keys");
        let value = self.get(rank.unwrap_or(RANK_WILDCARD), key, None)?;
        // SAFETY: `value.0` is a valid value returned by PMIx_Get, alive until `value` drops.
        let v = unsafe { &*value.0 };
        Ok(match u32::from(v.type_) {
            // SAFETY: the type tag says the union holds a uint32.
            sys::PMIX_UINT32 => Some(unsafe { v.data.uint32 }),
            // SAFETY: the type tag says the union holds a uint16.
            sys::PMIX_UINT16 => Some(u32::from(unsafe { v.data.uint16 })),
            _ => None,
        })
    }

    /// The job size (`PMIX_JOB_SIZE`).
    pub(crate) fn job_size(&self) -> Result<Option<u32>, Status> {
        self.get_uint(None, sys::PMIX_JOB_SIZE)
    }

    /// This process's rank among the job's processes on this node (`PMIX_LOCAL_RANK`).
    pub(crate) fn local_rank(&self) -> Result<Option<u32>, Status> {
        self.get_uint(Some(self.me.rank), sys::PMIX_LOCAL_RANK)
    }

    /// The job's processes on this node (`PMIX_LOCAL_SIZE`).
    pub(crate) fn local_size(&self) -> Result<Option<u32>, Status> {
        self.get_uint(None, sys::PMIX_LOCAL_SIZE)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // SAFETY: balances the PMIx_Init of `init`; no info array. A failure here has no one
        // to report to.
        let _ = unsafe { sys::PMIx_Finalize(ptr::null(), 0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_match_the_header() {
        // The generated bindings carry the header's values; these pin the ones the wrappers
        // name by hand or convert.
        assert_eq!(sys::PMIX_SUCCESS, 0);
        assert_eq!(Status::TIMEOUT.0, -24);
        assert_eq!(Status::NOT_FOUND.0, -46);
        assert_eq!(sys::PMIX_MAX_NSLEN, 255);
        assert_eq!(sys::PMIX_TIMEOUT, b"pmix.timeout\0");
        assert_eq!(core::mem::size_of::<sys::pmix_proc_t>(), 256 + 4);
        assert_eq!(
            core::mem::size_of::<sys::pmix_byte_object_t>(),
            2 * core::mem::size_of::<usize>()
        );
    }

    #[test]
    fn error_strings_come_from_the_library() {
        let text = Status::TIMEOUT.to_string();
        assert!(text.contains("-24"), "{text}");
        assert!(text.to_ascii_uppercase().contains("TIMEOUT"), "{text}");
        assert!(library_version().contains("4."), "{}", library_version());
    }
}
