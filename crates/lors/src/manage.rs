//! Operations on an existing exNode: augment (more replicas, copied depot to
//! depot), trim (drop mappings, optionally releasing their allocations),
//! refresh (extend leases), modify (strip capabilities for sharing), route
//! (augment onto target depots, then trim the rest), and probing for stat:
//! a file per job (`replicate`, `trim`, `refresh`, `probe`) and the
//! per-depot runner they share (`depots`). Queries of the exNode alone
//! (its blocks, its copies policy, what no live mapping covers) are
//! methods of [`lors_exnode::ExNode`].
mod depots;
mod probe;
mod refresh;
mod replicate;
mod trim;

pub(crate) use depots::{Failure, by_depot};
pub use probe::{Probe, probe_all, probe_many};
pub use refresh::{Lease, refresh};
pub use replicate::{CopyOptions, Replicas, augment, replicate};
pub use trim::{Selection, Trimmed, modify, trim};
