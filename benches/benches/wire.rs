//! Wire formats: what connecting a rank costs in encoding and validating peer bytes.
#![allow(missing_docs)] // criterion_main! generates an undocumented `main`.

use core::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rverbs_core::params::{Mtu, Psn};
use rverbs_core::sge::RemoteMemory;
use rverbs_core::wire::{node_blob_len, Endpoint, NodeBlob};

const WORLD: u32 = 64;

fn endpoint(rank: u32) -> Endpoint {
    let mut gid = [0u8; 16];
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid[12..].copy_from_slice(&(0x0a00_0001 + rank).to_be_bytes());
    Endpoint {
        qpn: 0x11 + rank,
        psn: Psn::wrapping(0x00ab_cdef ^ rank),
        lid: 0,
        gid,
        global: true,
        mtu: Mtu::B4096,
    }
}

fn bench_endpoint(c: &mut Criterion) {
    let e = endpoint(7);
    let bytes = e.encode();
    let mut g = c.benchmark_group("endpoint");
    g.bench_function("encode", |b| b.iter(|| black_box(black_box(&e).encode())));
    g.bench_function("decode", |b| {
        b.iter(|| Endpoint::decode(black_box(&bytes[..])).expect("valid endpoint"))
    });
    g.finish();
}

fn bench_node_blob(c: &mut Criterion) {
    let mut blob = vec![0u8; node_blob_len(WORLD)];
    let flags = RemoteMemory {
        addr: 0x7f00_0000_0000,
        len: 8 * u64::from(WORLD),
        rkey: 0x1234,
    };
    let window = RemoteMemory {
        addr: 0x7f00_0001_0000,
        len: 1 << 20,
        rkey: 0x5678,
    };
    NodeBlob::encode_into(&mut blob, 3, WORLD, endpoint, flags, window).expect("encodes");
    let mut g = c.benchmark_group("node_blob");
    g.throughput(Throughput::Bytes(blob.len() as u64));
    g.bench_function("decode/world64", |b| {
        b.iter(|| {
            NodeBlob::decode(black_box(&blob[..]))
                .expect("valid blob")
                .world
        })
    });
    g.finish();
}

criterion_group!(benches, bench_endpoint, bench_node_blob);
criterion_main!(benches);
