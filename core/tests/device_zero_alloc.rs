//! Proof that the data path does not allocate: a counting global allocator watches 100,000
//! mixed operations (blocking, scoped, batched) on a real device after connecting.
#![allow(clippy::std_instead_of_core)] // test code

#[macro_use]
mod support;

use rverbs_core::verbs::AccessFlags;
use rverbs_testkit::allocs_all;

// Counts every thread's allocations: the device library's, if it had threads, count too.
#[global_allocator]
static GLOBAL: rverbs_testkit::Counting = rverbs_testkit::Counting;

#[test]
fn hundred_thousand_mixed_operations_allocate_nothing() {
    let (_ctx, pd, mut a, mut b) =
        setup!("hundred_thousand_mixed_operations_allocate_nothing", default channels);
    let mut src = support::pattern(4096, 11);
    let dst = vec![0u8; 4096].into_boxed_slice();
    let mut rbuf = vec![0u8; 4096];
    let mut back = vec![0u8; 4096];
    let src_mr = pd.register(&mut src, AccessFlags::LOCAL_WRITE).unwrap();
    let dst_mr = pd
        .register_shared(
            dst,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    let mut r_mr = pd.register(&mut rbuf, AccessFlags::LOCAL_WRITE).unwrap();
    let mut back_mr = pd.register(&mut back, AccessFlags::LOCAL_WRITE).unwrap();
    let remote = dst_mr.remote();
    let one = [src_mr.sge(0..64).unwrap()];
    let eight: [[rverbs_core::sge::Sge<'_>; 1]; 8] =
        core::array::from_fn(|i| [src_mr.sge(i * 64..(i + 1) * 64).unwrap()]);

    const OPS: u64 = 100_000;
    let before = allocs_all();
    let mut ops = 0u64;
    let mut round = 0u64;
    while ops < OPS {
        match round % 4 {
            0 => {
                a.write(&one, remote).unwrap();
                ops += 1;
            }
            1 => {
                let mut scatter = [r_mr.sge_mut(0..64).unwrap()];
                let info = b
                    .scope(|s| {
                        let r = s.recv(&mut scatter).unwrap();
                        a.send(&one).unwrap();
                        s.wait(r).unwrap()
                    })
                    .unwrap();
                assert_eq!(info.byte_len, 64);
                ops += 2;
            }
            2 => {
                let mut batch = a.batch();
                for (i, s) in eight.iter().enumerate() {
                    batch
                        .write(s, remote.slice((i * 64) as u64, 64).unwrap())
                        .unwrap();
                }
                batch.run().unwrap();
                ops += 8;
            }
            _ => {
                a.read(&mut [back_mr.sge_mut(0..64).unwrap()], remote)
                    .unwrap();
                ops += 1;
            }
        }
        round += 1;
    }
    let allocs = allocs_all() - before;
    eprintln!("{ops} operations in {round} rounds: {allocs} heap allocations");
    assert_eq!(allocs, 0, "the data path allocated");
    // The counter is live: an allocation now is seen.
    let probe = std::hint::black_box(vec![1u8; 16]);
    assert!(
        allocs_all() > before + allocs,
        "counting allocator is not installed"
    );
    drop(probe);
    assert_eq!(&back_mr.as_slice()[..64], &src_mr.as_slice()[..64]);
}
