//! LoRS operations over IBP depots: files become exNodes of striped,
//! replicated, time-limited allocations ("IBP Deployment Tests and Integration with DiDaS Project" §5, the LoCI iGrid 2002 paper (Video IBPster) §3).
//!
//! * [`upload`] — cut input into blocks, place each on the least-busy depot,
//!   make extra copies depot-to-depot (SEND), return the exNode.
//! * [`download`] — the adaptive engine: per-depot workers ask a sans-I/O
//!   scheduler ([`download::sched`]) for the next block their depot holds;
//!   failures go to another replica; stragglers are fetched again
//!   elsewhere, first finisher wins.
//! * [`dissem`] — one file to many sites ("DDMG: A Data Dissemination Mechanism for Grid Environments"): the sites relay to
//!   each other depot to depot, as a sans-I/O scheduler decides.
//! * [`manage`] — augment, route, trim, refresh: copies depot to depot,
//!   paired source to target by [`burst`] so a move between sites keeps
//!   every link busy.
//! * [`plan`] — cutting a byte range into servable segments; a sparse
//!   file's holes need none.
//! * [`pool`] — reused depot connections.
//! * [`verify`] — every replica read back and checked (a scrub).
//! * [`keep`] — a keeper cycle: leases refreshed, lost copies remade.

pub mod burst;
pub mod commit;
pub mod directory;
pub mod dissem;
pub mod download;
pub mod error;
pub mod job;
pub mod keep;
pub mod leftover;
pub mod manage;
pub mod plan;
pub mod pool;
pub mod progress;
pub mod rate;
pub mod repair;
pub mod settings;
pub mod share;
pub mod stall;
pub mod upload;
pub mod uri;
pub mod verify;
pub mod xio;
pub mod xnd;
pub mod xndrc;

pub use error::{Cause, Error, Result};
pub use pool::Pool;
pub use progress::{NoProgress, Progress};
