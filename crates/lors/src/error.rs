//! Errors of LoRS operations.

use std::fmt;

use lors_ibp::StatusCode;

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a depot operation failed: the message for people, and the IBP
/// status, when a depot answered with one, for programs. Decisions (an
/// errno, a hint, a retry) are made on the status, never on the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    /// What happened, for people.
    pub text: String,
    /// The depot's status, if it answered with one.
    pub code: Option<StatusCode>,
    /// The depot (`host:port`) the failure was on, when one was.
    pub depot: Option<String>,
}

impl Cause {
    /// A cause no depot status goes with.
    pub fn local(text: impl Into<String>) -> Cause {
        Cause {
            text: text.into(),
            code: None,
            depot: None,
        }
    }
}

impl From<&lors_ibp::Error> for Cause {
    fn from(e: &lors_ibp::Error) -> Cause {
        Cause {
            text: e.to_string(),
            code: e.status(),
            depot: None,
        }
    }
}

impl From<&Error> for Cause {
    fn from(e: &Error) -> Cause {
        Cause {
            text: e.to_string(),
            code: e.status(),
            depot: e.depot().map(str::to_owned),
        }
    }
}

impl From<&str> for Cause {
    fn from(text: &str) -> Cause {
        Cause::local(text)
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// What went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No depots to work with.
    #[error("no depots to place data on")]
    NoDepots,
    /// Fewer depots than copies requested.
    #[error(
        "{copies} copies need {copies} distinct depots but only {depots} are usable: add depots or ask for fewer copies"
    )]
    NotEnoughDepots {
        /// Copies asked for.
        copies: usize,
        /// Depots usable.
        depots: usize,
    },
    /// Fewer depots than the blocks of an erasure-coded stripe.
    #[error(
        "a {scheme} stripe needs {} distinct depots but only {depots} are usable: add depots or choose a smaller code", scheme.blocks()
    )]
    NotEnoughDepotsForStripe {
        /// The code asked for.
        scheme: lors_exnode::erasure::Scheme,
        /// Depots usable.
        depots: usize,
    },
    /// A repair asked of a file that is not erasure-coded.
    #[error(
        "the file is not erasure-coded: --repair remakes lost blocks of files uploaded with --ec; add copies with -c"
    )]
    NotErasureCoded,
    /// An erasure code could not be computed or its record read.
    #[error(transparent)]
    Erasure(#[from] lors_exnode::erasure::ErasureError),
    /// A block could not be stored on any depot.
    #[error("block at offset {offset} could not be stored on any depot; last error: {last}")]
    Store {
        /// Logical offset.
        offset: u64,
        /// Last depot error.
        last: Cause,
    },
    /// An upload failed with `cause`. What it had stored was released, except
    /// the allocations in `stranded` (their depots could not be reached):
    /// record them so they can be freed later, or they hold space until their
    /// lease ends.
    #[error("{}", chain(cause))]
    Abandoned {
        /// Why the upload failed.
        cause: Box<Error>,
        /// Allocations released.
        released: usize,
        /// Allocations still held, as mappings with their capabilities.
        stranded: lors_exnode::ExNode,
    },
    /// The upload was told to stop (SIGINT, SIGTERM) before it finished.
    #[error("interrupted: {} blocks of the file were stored", stored.mappings.iter().map(|m| m.exnode_offset).collect::<std::collections::BTreeSet<_>>().len())]
    Interrupted {
        /// The blocks stored whole, every copy: what a resumed upload
        /// need not send again.
        stored: Box<lors_exnode::ExNode>,
        /// Allocations of blocks in flight, released.
        released: usize,
        /// Allocations of blocks in flight that could not be released in
        /// time: incomplete, to be freed (`lors trim --decrement`).
        stranded: lors_exnode::ExNode,
    },
    /// A trim would remove every replica of a block.
    #[error(
        "trimming would remove the last replica of bytes {offset}..{end} (pass --allow-holes to do it anyway)"
    )]
    LastReplica {
        /// First byte.
        offset: u64,
        /// One past the last byte.
        end: u64,
    },
    /// A trim would leave a stripe of an erasure-coded file with fewer
    /// blocks than it needs to be read.
    #[error(
        "trimming would leave stripe {stripe} (bytes {}..{}) with {left} of the {need} blocks it needs (pass --allow-holes to do it anyway)", bytes.start, bytes.end
    )]
    StripeBelowNeed {
        /// The stripe.
        stripe: u64,
        /// Its bytes.
        bytes: std::ops::Range<u64>,
        /// Blocks it would keep.
        left: usize,
        /// Blocks it needs (`k`).
        need: usize,
    },
    /// Part of the file cannot be read from any replica.
    #[error("bytes {offset}..{end} could not be read from any replica; last error: {last}")]
    Unreadable {
        /// First byte.
        offset: u64,
        /// One past the last byte.
        end: u64,
        /// Last depot error.
        last: Cause,
    },
    /// Stripes of an erasure-coded file with more blocks lost than its
    /// parity covers.
    #[error("{} of an erasure-coded ({scheme}) file cannot be read: more than {} of their {} blocks are lost: {}; last error: {last}",
        if stripes.len() == 1 { "1 stripe".to_owned() } else { format!("{} stripes", stripes.len()) },
        scheme.parity, scheme.blocks(), list_stripes(stripes))]
    StripesLost {
        /// The code.
        scheme: lors_exnode::erasure::Scheme,
        /// Each stripe lost and its bytes.
        stripes: Vec<(u64, std::ops::Range<u64>)>,
        /// Last depot error.
        last: Cause,
    },
    /// The exNode does not cover the requested range.
    #[error(transparent)]
    Plan(#[from] crate::plan::PlanError),
    /// Local file I/O. The OS error is the [`std::error::Error::source`],
    /// not repeated in the message (`{:#}` of an `anyhow` chain prints both).
    #[error("{what}")]
    Io {
        /// What we were doing.
        what: String,
        /// OS error.
        source: std::io::Error,
    },
    /// A depot operation failed.
    #[error(transparent)]
    Ibp(#[from] lors_ibp::Error),
    /// Another run holds the lock of this exNode ([`crate::commit::Lock`]).
    #[error("{} is being changed by another lors command{}: try again when it is done", .path.display(), .holder.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    Busy {
        /// The exNode.
        path: std::path::PathBuf,
        /// The holder's pid, as its lock file says.
        holder: Option<u32>,
    },
    /// The exNode changed between the moment a command chose what to change
    /// in it (mapping numbers) and the moment it held its lock.
    #[error("{} changed while this command waited for it: run it again (see lors ls)", .path.display())]
    Changed {
        /// The exNode.
        path: std::path::PathBuf,
    },
    /// An `.xnd` file (an exNode, or the record beside one) could not be
    /// read or saved.
    #[error(transparent)]
    Xnd(#[from] crate::xnd::XndError),
    /// [`crate::commit::remove`] left allocations a depot did not release:
    /// the exNode stays, emptied, beside the record naming them.
    #[error("{count} allocations not released ({why}); the emptied exNode stays, with what is left named in {}: remove it again to finish", .record.display())]
    NotReleased {
        /// How many.
        count: usize,
        /// Why the first was not.
        why: String,
        /// The record naming them.
        record: std::path::PathBuf,
    },
}

/// An error and its sources, as `anyhow` prints them with `{:#}`.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut next = e.source();
    while let Some(c) = next {
        s.push_str(": ");
        s.push_str(&c.to_string());
        next = c.source();
    }
    s
}

impl Error {
    /// The IBP status behind this error, when a depot answered with one.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Error::Ibp(e) => e.status(),
            Error::Store { last, .. }
            | Error::Unreadable { last, .. }
            | Error::StripesLost { last, .. } => last.code,
            Error::Abandoned { cause, .. } => cause.status(),
            _ => None,
        }
    }

    /// The depot behind this error, when one failure on one depot is.
    pub fn depot(&self) -> Option<&str> {
        match self {
            Error::Store { last, .. }
            | Error::Unreadable { last, .. }
            | Error::StripesLost { last, .. } => last.depot.as_deref(),
            Error::Abandoned { cause, .. } => cause.depot(),
            _ => None,
        }
    }

    /// The bytes of the file this error is about, when it names them.
    pub fn range(&self) -> Option<std::ops::Range<u64>> {
        match self {
            Error::Unreadable { offset, end, .. } | Error::LastReplica { offset, end } => {
                Some(*offset..*end)
            }
            Error::StripesLost { stripes, .. } => {
                let start = stripes.iter().map(|(_, r)| r.start).min()?;
                let end = stripes.iter().map(|(_, r)| r.end).max()?;
                Some(start..end)
            }
            Error::StripeBelowNeed { bytes, .. } => Some(bytes.clone()),
            Error::Abandoned { cause, .. } => cause.range(),
            _ => None,
        }
    }

    /// A copying run told to stop: of the `made` allocations it released
    /// all but `kept`, which it names as stranded.
    pub(crate) fn stopped(made: usize, kept: Vec<lors_exnode::Mapping>) -> Self {
        Error::Interrupted {
            stored: Box::default(),
            released: made - kept.len(),
            stranded: lors_exnode::ExNode {
                mappings: kept,
                ..lors_exnode::ExNode::default()
            },
        }
    }

    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}

/// `stripe 0 (bytes 0..6291456), …`: the first ten.
fn list_stripes(stripes: &[(u64, std::ops::Range<u64>)]) -> String {
    let mut out: Vec<String> = (stripes.iter().take(10))
        .map(|(s, r)| format!("stripe {s} (bytes {}..{})", r.start, r.end))
        .collect();
    if stripes.len() > 10 {
        out.push(format!("and {} more", stripes.len() - 10));
    }
    out.join(", ")
}
