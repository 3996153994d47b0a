//! Hard limits on what a peer may send. Every one exists so that a hostile or
//! broken peer cannot make us allocate, wait or loop without bound.

/// Longest request or reply line we accept, in bytes including the newline.
/// The reference depot reads commands into a 4 KiB buffer; the longest
/// legitimate line (SEND with a full capability) is well under 1 KiB.
pub const MAX_LINE_BYTES: usize = 4096;

/// Most whitespace-separated fields in one line. ALLOCATE and SEND, the widest
/// commands we parse, have 11.
pub const MAX_FIELDS: usize = 16;

/// Longest key token (`RID#KEY`) in bytes. Our keys are 32 characters; LoCI 1.4
/// depots use `IBP-` plus 90 characters.
pub const MAX_KEY_BYTES: usize = 256;

/// Longest resource id in bytes.
pub const MAX_RID_BYTES: usize = 64;

/// Longest capability URL in bytes.
pub const MAX_CAP_BYTES: usize = 1024;

/// Longest STATUS password in bytes.
pub const MAX_PASSWORD_BYTES: usize = 256;

/// Largest number of bytes one STATUS reply body may announce (client side).
pub const MAX_STATUS_BODY_BYTES: usize = 64 * 1024;

/// Largest checksum block size accepted in a checksummed request: the
/// reference depot's limit for checksum blocks (2 GiB).
pub const MAX_CHKSUM_BLOCK: u64 = 1 << 31;
