//! exNodes: a network file as a set of *mappings*, each saying "logical bytes
//! `[exnode_offset, exnode_offset + logical_length)` live in this IBP
//! allocation, after these end-to-end functions" ("IBP Deployment Tests and Integration with DiDaS Project" §3.2.2).
//!
//! * [`model`] — [`ExNode`], [`Mapping`], [`Function`], [`Metadata`]; no I/O.
//! * [`erasure`] — erasure-coded files: stripes of k data and m parity
//!   blocks (Reed-Solomon), their layout in the exNode, encode and rebuild.
//! * [`numbering`] — [`Numbering`]: mapping numbers as the LoRS tools show
//!   and accept them.
//! * [`xml`] — the LoRS `.xnd` format, read with hard limits (size, depth,
//!   counts; no DTDs, no entity expansion) and written so the original LoRS
//!   0.82 tools can read it.
//!
//! ```
//! use lors_exnode::{ExNode, xml};
//! let text = r#"<?xml version="1.0"?>
//! <exnode xmlns:exnode="http://loci.cs.utk.edu/exnode">
//!   <exnode:metadata name="filename" type="string">a.bin</exnode:metadata>
//! </exnode>"#;
//! let x: ExNode = xml::parse(text.as_bytes()).unwrap();
//! assert_eq!(x.filename(), Some("a.bin"));
//! assert_eq!(xml::parse(xml::write(&x).as_bytes()).unwrap(), x);
//! ```

pub mod erasure;
pub mod functions;
pub mod model;
pub mod numbering;
pub mod xml;

pub use model::{ExNode, Function, Hole, Mapping, Metadata, Value};
pub use numbering::Numbering;
