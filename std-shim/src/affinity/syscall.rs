//! The calling thread's affinity mask: `sched_setaffinity` and `sched_getaffinity`.

use std::io;

use super::{AffinityError, CpuSet};

/// Pins the calling thread to `cpu` alone.
///
/// Affects only the calling thread (threads it spawns afterwards inherit the mask). Fails
/// with [`AffinityError::Syscall`] (`EINVAL`) when the CPU is offline or outside the
/// thread's cgroup cpuset.
pub fn pin_current_thread(cpu: u32) -> Result<(), AffinityError> {
    let set = CpuSet::single(cpu).map_err(|cpu| AffinityError::CpuOutOfRange { cpu })?;
    set_current_thread_affinity(&set)
}

/// Restricts the calling thread to the CPUs in `set`.
pub fn set_current_thread_affinity(set: &CpuSet) -> Result<(), AffinityError> {
    // SAFETY: the pointer and size describe `set.words`, which lives across the call and is
    // only read. Its layout is the kernel's cpumask (an array of `unsigned long`), and
    // `cpu_set_t` has the same alignment; glibc passes a size larger than `cpu_set_t`
    // through to the kernel unchanged. pid 0 names the calling thread.
    let rc = unsafe {
        libc::sched_setaffinity(
            0,
            core::mem::size_of_val(&set.words),
            set.words.as_ptr().cast::<libc::cpu_set_t>(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(AffinityError::Syscall {
            call: "sched_setaffinity",
            source: io::Error::last_os_error(),
        })
    }
}

/// The CPUs the calling thread is allowed to run on.
///
/// This is the thread's affinity mask, already narrowed by its cgroup cpuset and by any
/// `taskset`/`numactl` the process was started under, so it is the set to choose from.
pub fn current_thread_affinity() -> Result<CpuSet, AffinityError> {
    let mut set = CpuSet::new();
    // SAFETY: the pointer and size describe `set.words`, which is exclusively borrowed for
    // the call; the kernel writes at most that many bytes and glibc zeroes the rest of the
    // buffer. Every bit pattern is a valid `[c_ulong; N]`. pid 0 names the calling thread.
    let rc = unsafe {
        libc::sched_getaffinity(
            0,
            core::mem::size_of_val(&set.words),
            set.words.as_mut_ptr().cast::<libc::cpu_set_t>(),
        )
    };
    if rc == 0 {
        Ok(set)
    } else {
        Err(AffinityError::Syscall {
            call: "sched_getaffinity",
            source: io::Error::last_os_error(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::affinity::MAX_CPUS;

    // ---- real pinning (in a spawned thread, so the test harness's threads keep their mask) --

    #[test]
    fn pin_current_thread_and_read_back() {
        std::thread::spawn(|| {
            let allowed = current_thread_affinity().unwrap();
            assert!(!allowed.is_empty());
            let cpu = allowed.iter().last().unwrap();
            pin_current_thread(cpu).unwrap();
            assert_eq!(
                current_thread_affinity().unwrap(),
                CpuSet::single(cpu).unwrap()
            );

            // Restore a wider mask and check it sticks.
            set_current_thread_affinity(&allowed).unwrap();
            assert_eq!(current_thread_affinity().unwrap(), allowed);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn pinning_to_a_cpu_out_of_range_or_an_empty_mask_is_refused() {
        std::thread::spawn(|| {
            assert!(matches!(
                pin_current_thread(MAX_CPUS),
                Err(AffinityError::CpuOutOfRange { cpu: MAX_CPUS })
            ));
            // An empty mask is refused by the kernel.
            let e = set_current_thread_affinity(&CpuSet::new()).unwrap_err();
            assert!(matches!(
                &e,
                AffinityError::Syscall {
                    call: "sched_setaffinity",
                    ..
                }
            ));
            assert_eq!(e.to_string(), "sched_setaffinity failed");
        })
        .join()
        .unwrap();
    }
}
