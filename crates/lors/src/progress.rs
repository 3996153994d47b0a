//! Progress reporting. The library calls these hooks; the CLI draws bars.

/// Receives progress events. All methods have no-op defaults.
pub trait Progress: Send + Sync {
    /// The total number of bytes the operation will move, when known.
    fn start(&self, _total: Option<u64>) {}
    /// `bytes` more bytes are done.
    fn advance(&self, _bytes: u64) {}
    /// A non-fatal event worth telling the user (a depot failed, a retry).
    fn note(&self, _message: &str) {}
}

/// Reports nothing.
pub struct NoProgress;

impl Progress for NoProgress {}
