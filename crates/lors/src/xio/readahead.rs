//! The read-ahead policy, pure: what a read that missed the cache does.
//!
//! A read that continues where the last one ended (or whose byte before is
//! cached: the kernel's parallel read-ahead through FUSE arrives out of
//! order by a little) is sequential and starts a read-ahead of the rest of
//! the file, up to [`STREAM_SPAN`]; a read elsewhere fetches its aligned
//! [`FETCH`] stretch alone. While a read-ahead runs, a read in its window
//! takes (or waits for) its next piece, and a read just behind it, or
//! anywhere while another reader holds it, is fetched on the side so the
//! read-ahead goes on.

use super::{FETCH, STREAM_SPAN};

/// The read-ahead running, as a missed read sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Running {
    /// Where its next piece starts.
    pub next: u64,
    /// One past its last byte.
    pub end: u64,
    /// Whether a reader can take its next piece now (no other is waiting
    /// for it).
    pub free: bool,
}

/// A read of byte `off` that missed the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Miss {
    /// The byte wanted.
    pub off: u64,
    /// The file's size.
    pub size: u64,
    /// The read continues the last one.
    pub sequential: bool,
    /// Bytes the read-ahead may run ahead of the reader.
    pub readahead: u64,
    /// The read-ahead, if one runs.
    pub running: Option<Running>,
}

/// What the read does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// The byte is past the end of the file.
    Eof,
    /// Take the read-ahead's next piece.
    Next,
    /// Another reader is taking the next piece: wait for it to arrive.
    Wait,
    /// Fetch `[start, start + len)` on the side; the read-ahead goes on.
    Side {
        /// First byte.
        start: u64,
        /// Bytes.
        len: u64,
    },
    /// (Re)start the read-ahead at `start` for `len` bytes.
    Start {
        /// First byte.
        start: u64,
        /// Bytes.
        len: u64,
    },
}

/// The policy.
pub(super) fn decide(m: &Miss) -> Step {
    if m.off >= m.size {
        return Step::Eof;
    }
    let ahead = m.readahead.max(2 * FETCH);
    let start = m.off - m.off % FETCH;
    let stretch = FETCH.min(m.size - start);
    match m.running {
        Some(s) if s.next <= m.off && m.off < s.end.min(s.next + ahead) => {
            if s.free {
                Step::Next
            } else {
                Step::Wait
            }
        }
        Some(s) if !s.free || !m.sequential && m.off < s.next && s.next - m.off <= ahead => {
            Step::Side {
                start,
                len: stretch,
            }
        }
        _ => Step::Start {
            start,
            len: if m.sequential {
                (m.size - start).min(STREAM_SPAN)
            } else {
                stretch
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn miss(off: u64, sequential: bool, running: Option<Running>) -> Miss {
        Miss {
            off,
            size: 100 * MIB,
            sequential,
            readahead: 32 * MIB,
            running,
        }
    }

    fn running(next: u64, free: bool) -> Option<Running> {
        Some(Running {
            next,
            end: 100 * MIB,
            free,
        })
    }

    #[test]
    fn a_sequential_read_starts_a_read_ahead_of_the_rest() {
        assert_eq!(
            decide(&miss(5 * MIB + 7, true, None)),
            Step::Start {
                start: 5 * MIB,
                len: 95 * MIB
            }
        );
        // Never more than STREAM_SPAN planned at once.
        let huge = Miss {
            size: u64::MAX,
            ..miss(0, true, None)
        };
        assert_eq!(
            decide(&huge),
            Step::Start {
                start: 0,
                len: STREAM_SPAN
            }
        );
    }

    #[test]
    fn a_random_read_fetches_its_stretch_alone() {
        assert_eq!(
            decide(&miss(70 * MIB + 1, false, None)),
            Step::Start {
                start: 70 * MIB,
                len: MIB
            }
        );
        // The last stretch is cut at the end of the file.
        let tail = Miss {
            size: 70 * MIB + 10,
            ..miss(70 * MIB + 1, false, None)
        };
        assert_eq!(
            decide(&tail),
            Step::Start {
                start: 70 * MIB,
                len: 10
            }
        );
        assert_eq!(decide(&miss(100 * MIB, true, None)), Step::Eof);
    }

    #[test]
    fn a_read_in_the_window_takes_or_waits_for_the_next_piece() {
        assert_eq!(
            decide(&miss(10 * MIB, true, running(8 * MIB, true))),
            Step::Next
        );
        assert_eq!(
            decide(&miss(10 * MIB, true, running(8 * MIB, false))),
            Step::Wait
        );
        // Past the window (next + read-ahead): a new read-ahead there.
        assert!(matches!(
            decide(&miss(60 * MIB, true, running(8 * MIB, true))),
            Step::Start { start, .. } if start == 60 * MIB
        ));
    }

    #[test]
    fn a_look_back_or_a_read_beside_a_busy_read_ahead_goes_on_the_side() {
        // Just behind the read-ahead, not sequential: on the side.
        assert_eq!(
            decide(&miss(7 * MIB + 5, false, running(8 * MIB, true))),
            Step::Side {
                start: 7 * MIB,
                len: MIB
            }
        );
        // Anywhere while another reader holds the read-ahead: on the side.
        assert_eq!(
            decide(&miss(90 * MIB, false, running(8 * MIB, false))),
            Step::Side {
                start: 90 * MIB,
                len: MIB
            }
        );
        // Far behind, with the read-ahead free: it moves there.
        assert!(matches!(
            decide(&miss(MIB, false, running(80 * MIB, true))),
            Step::Start { start, len } if start == MIB && len == MIB
        ));
    }
}
