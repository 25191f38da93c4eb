//! Tables cut to measure: rank 0 may send each rank only what the other ranks' blobs hold
//! for it, instead of every blob whole.

use core::fmt::Debug;

/// How rank 0 cuts the table of an exchange down to what each rank needs.
///
/// In a plain exchange every rank receives every blob whole: N blobs to each of N ranks.
/// When a blob holds one thing per peer (rverbs-core's node blob holds the queue pair its
/// rank made for every other rank, 32 bytes each), that is O(N²) bytes per rank and O(N³)
/// from rank 0, which stops working long before a world of thousands. Set in
/// [`ExchangeOptions::personalize`](super::ExchangeOptions::personalize), a `Personalize`
/// makes rank 0 send rank `i` a table whose entry `j` is [`cut`](Self::cut)`(i, j, blob of
/// j)`, and whose entry `i` is empty; [`exchange`](super::exchange) hands rank `i` that
/// table with its own blob back in entry `i`. [`NodeBlobs`](super::NodeBlobs) does this for
/// node blobs, and `connect()` uses it.
///
/// Every rank must set the same personalization: a rank that expects a plain table refuses
/// one that does not echo its own blob, and the other way round.
///
/// Only the exchange is personalized; the session's later
/// [`allgather`](super::Session::allgather) rounds stay plain and keep
/// [`max_blob_size`](super::ExchangeOptions::max_blob_size) as their limit.
///
/// # Limits
///
/// The two limits derive from the world size, so a world of any size gets frames that fit,
/// and no frame, from a stranger or from rank 0, can make a rank allocate more than the
/// world size justifies. Both are capped at [`MAX_PAYLOAD`](crate::wire::MAX_PAYLOAD).
pub trait Personalize: Debug + Send + Sync {
    /// The largest blob a rank of a world of `world_size` sends, and rank 0 accepts in a
    /// `Hello`. It replaces `max_blob_size` for the exchange.
    fn blob_limit(&self, world_size: u32) -> usize;

    /// The largest entry [`cut`](Self::cut) produces in a world of `world_size`. A rank
    /// refuses a table with a longer entry, and its frame limit follows from this one.
    fn entry_limit(&self, world_size: u32) -> usize;

    /// Why `rank`'s `blob` is unfit, if it is. Every rank checks its own blob before the
    /// exchange starts; rank 0 checks each `Hello` and refuses the sender with this reason.
    /// Runs once per blob, so it may read the whole blob.
    ///
    /// # Errors
    /// The reason, sent to the refused rank and kept in rank 0's error if the exchange
    /// times out.
    fn check(&self, rank: u32, world_size: u32, blob: &[u8]) -> Result<(), String>;

    /// Appends to `out` what rank `for_rank` is to receive of rank `from_rank`'s `blob`: at
    /// most [`entry_limit`](Self::entry_limit) bytes. `blob` passed [`check`](Self::check),
    /// and `for_rank != from_rank`. Rank 0 calls it N(N-1) times, so it should cost O(1),
    /// not O(blob).
    fn cut(&self, for_rank: u32, from_rank: u32, blob: &[u8], out: &mut Vec<u8>);
}
