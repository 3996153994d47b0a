//! The LoRS exNode XML format (`.xnd`), `docs/exnode.md`.
//!
//! Reading streams events straight into the model — no DOM — with hard limits
//! checked as it goes ([`Limits`]): a hostile file cannot make us allocate much
//! more than its own size, nest without bound, or expand entities (DTDs are
//! refused; only the five predefined entities and character references exist).

mod read;
mod write;

pub use read::{XmlError, parse, parse_with};
pub use write::write;

/// The exNode namespace URI; elements are found by it, whatever their prefix.
pub const NAMESPACE: &str = "http://loci.cs.utk.edu/exnode";

/// The `lorsversion` we write: the original tools warn when the first decimal
/// of a file's version differs from theirs (0.82x).
pub const LORS_VERSION: f64 = 0.828;

/// Hard limits for reading.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest document, in bytes.
    pub max_bytes: usize,
    /// Deepest element nesting.
    pub max_depth: usize,
    /// Most mappings.
    pub max_mappings: usize,
    /// Most metadata items or arguments in one element.
    pub max_items: usize,
    /// Longest text content or attribute value, in bytes.
    pub max_text_bytes: usize,
    /// Longest element or attribute name, in bytes.
    pub max_name_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // A 10 TiB file in 10 MiB blocks with 3 copies is ~3 M mappings
            // at ~700 bytes each; larger exNodes should be split.
            max_bytes: 1 << 30,
            max_depth: 32,
            max_mappings: 4_000_000,
            max_items: 1024,
            max_text_bytes: 64 * 1024,
            max_name_bytes: 256,
        }
    }
}
