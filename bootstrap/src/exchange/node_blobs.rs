//! The personalization for rverbs-core node blobs: each rank receives, of every peer's
//! blob, the addressed form for itself.

use rverbs_core::wire::node::{node_blob_len, NodeBlob, ADDRESSED_BLOB_LEN, MAX_WORLD};

use super::personalize::Personalize;

/// Cuts every peer's [node blob](rverbs_core::wire::node) down to its addressed form for
/// the receiving rank: the endpoint made for that rank, the flag array and the window, 96
/// bytes. A rank then receives about 104 bytes per peer (entry header included) instead of
/// every full blob of `32 N + 64` bytes; at 1024 ranks, 104 KiB instead of 32 MiB.
///
/// The `Hello` limit is the exact length of a full blob in the world at hand (131 KiB at
/// [`MAX_WORLD`]), and rank 0 refuses a hello whose blob does not decode, or names another
/// rank or world size than the frame that carries it.
///
/// ```no_run
/// use rverbs_bootstrap::{ExchangeOptions, NodeBlobs};
///
/// let options = ExchangeOptions {
///     personalize: Some(&NodeBlobs),
///     ..ExchangeOptions::default()
/// };
/// # let _ = options;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeBlobs;

impl Personalize for NodeBlobs {
    fn blob_limit(&self, world_size: u32) -> usize {
        // No valid blob is longer, whatever the world size claims.
        node_blob_len(world_size.clamp(1, MAX_WORLD))
    }

    fn entry_limit(&self, _world_size: u32) -> usize {
        ADDRESSED_BLOB_LEN
    }

    fn check(&self, rank: u32, world_size: u32, blob: &[u8]) -> Result<(), String> {
        let decoded =
            NodeBlob::decode(blob).map_err(|error| format!("not a node blob: {error}"))?;
        if decoded.addressee().is_some() {
            return Err("an addressed node blob, where the full blob belongs".to_owned());
        }
        if decoded.rank != rank || decoded.world != world_size {
            return Err(format!(
                "node blob of rank {} of {}, sent as rank {rank} of {world_size}",
                decoded.rank, decoded.world
            ));
        }
        Ok(())
    }

    fn cut(&self, for_rank: u32, _from_rank: u32, blob: &[u8], out: &mut Vec<u8>) {
        // `check` accepted the blob, so this cannot fail; were it to, the empty entry makes
        // the receiver's decoder name the sender.
        if let Ok(addressed) = NodeBlob::cut_for(blob, for_rank) {
            out.extend_from_slice(&addressed);
        }
    }
}

#[cfg(test)]
mod tests {
    use rverbs_core::params::{Mtu, Psn};
    use rverbs_core::sge::RemoteMemory;
    use rverbs_core::wire::Endpoint;

    use super::*;

    fn blob(rank: u32, world: u32) -> Vec<u8> {
        let mut out = vec![0; node_blob_len(world)];
        let endpoint = |peer: u32| Endpoint {
            qpn: rank * 16 + peer,
            psn: Psn::new(peer).unwrap(),
            lid: 1,
            gid: [0; 16],
            global: false,
            mtu: Mtu::B1024,
        };
        let flags = RemoteMemory {
            addr: 4096,
            len: 8 * u64::from(world),
            rkey: 1,
        };
        NodeBlob::encode_into(&mut out, rank, world, endpoint, flags, flags).unwrap();
        out
    }

    #[test]
    fn limits_follow_the_world_size() {
        assert_eq!(NodeBlobs.blob_limit(1024), 16 + 32 * 1024 + 48);
        assert_eq!(NodeBlobs.blob_limit(4096), 16 + 32 * 4096 + 48);
        assert_eq!(NodeBlobs.blob_limit(u32::MAX), NodeBlobs.blob_limit(4096));
        assert_eq!(NodeBlobs.entry_limit(4096), 96);
    }

    #[test]
    fn checks_the_blob_against_its_frame() {
        let b = blob(1, 3);
        assert_eq!(NodeBlobs.check(1, 3, &b), Ok(()));
        assert!(NodeBlobs
            .check(2, 3, &b)
            .unwrap_err()
            .contains("rank 1 of 3"));
        assert!(NodeBlobs
            .check(1, 4, &b)
            .unwrap_err()
            .contains("rank 1 of 3"));
        assert!(NodeBlobs
            .check(1, 3, &b[1..])
            .unwrap_err()
            .contains("not a node blob"));
        let mut addressed = Vec::new();
        NodeBlobs.cut(0, 1, &b, &mut addressed);
        assert!(NodeBlobs
            .check(1, 3, &addressed)
            .unwrap_err()
            .contains("addressed"));
    }

    #[test]
    fn cuts_the_addressed_form() {
        let b = blob(1, 3);
        let mut out = b"keep".to_vec();
        NodeBlobs.cut(2, 1, &b, &mut out);
        assert_eq!(&out[..4], b"keep");
        assert_eq!(out.len(), 4 + ADDRESSED_BLOB_LEN);
        let d = NodeBlob::decode(&out[4..]).unwrap();
        assert_eq!((d.rank, d.addressee()), (1, Some(2)));
        let mut none = Vec::new();
        NodeBlobs.cut(1, 1, &b, &mut none);
        assert!(none.is_empty());
    }
}
