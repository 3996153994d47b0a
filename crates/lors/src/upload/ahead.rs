//! Allocations made ahead, for depots far away.
//!
//! A block costs its depot an ALLOCATE round trip before the STORE can
//! start: on a LAN nothing, 188 ms away a round trip of idle link for
//! every block on every connection. So once distance has raised the
//! blocks in flight, each ALLOCATE a block sends brings one more back for
//! the next block on that depot: that block finds its allocation waiting
//! and starts its STORE at once. Those made ahead are in the upload's
//! ledger from their reply on, like any other, so whatever ends the upload
//! (its end, a failure, a signal) releases the ones no block used.

use std::collections::HashMap;
use std::sync::Mutex;

use lors_ibp::CapSet;

/// Allocations made ahead: the ready ones by depot, and how many are on
/// their way to each.
#[derive(Default)]
pub(super) struct Ahead {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The size of an allocation made ahead (the first block's); `None`
    /// until the first block asks.
    size: Option<u64>,
    /// Most ready or on their way per depot; 0: none are made.
    depth: usize,
    /// No more are made (the input has ended, or the upload is stopping).
    closed: bool,
    /// By depot: ready, and on their way.
    depots: HashMap<String, (Vec<CapSet>, usize)>,
}

impl Ahead {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes up to `depth` ahead for each depot from now on.
    pub(super) fn arm(&self, depth: usize) {
        self.state().depth = depth;
    }

    /// Makes no more (those on their way still arrive, into the ledger;
    /// the ready ones are still taken).
    pub(super) fn close(&self) {
        self.state().closed = true;
    }

    /// A ready allocation of `size` bytes on `addr`, if one is waiting;
    /// and whether to make another ahead for `addr` now (counted as on its
    /// way: [`Ahead::arrived`] must follow).
    pub(super) fn take(&self, addr: &str, size: u64) -> (Option<CapSet>, bool) {
        let mut s = self.state();
        if s.depth == 0 {
            return (None, false);
        }
        let want = *s.size.get_or_insert(size);
        let (depth, closed) = (s.depth, s.closed);
        let (ready, coming) = s.depots.entry(addr.to_owned()).or_default();
        let got = if size == want { ready.pop() } else { None };
        let more = !closed && size == want && ready.len() + *coming < depth;
        if more {
            *coming += 1;
        }
        (got, more)
    }

    /// One made ahead for `addr` has been answered: `caps` when the depot
    /// granted it (already in the ledger), kept ready for a block unless
    /// the upload is closing (then the ledger's end releases it).
    pub(super) fn arrived(&self, addr: &str, caps: Option<CapSet>) {
        let mut s = self.state();
        let closed = s.closed;
        let (ready, coming) = s.depots.entry(addr.to_owned()).or_default();
        *coming = coming.saturating_sub(1);
        if let Some(c) = caps.filter(|_| !closed) {
            ready.push(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(n: u8) -> CapSet {
        let c = |kind: &str| {
            lors_ibp::Capability::parse(&format!("ibp://d:6714/{n}#k/0/{kind}")).unwrap()
        };
        CapSet {
            read: c("READ"),
            write: c("WRITE"),
            manage: c("MANAGE"),
        }
    }

    #[test]
    fn none_are_made_unless_armed_or_after_close() {
        let a = Ahead::default();
        assert_eq!(a.take("d:6714", 10), (None, false));
        a.arm(2);
        assert_eq!(a.take("d:6714", 10), (None, true));
        a.arrived("d:6714", Some(caps(1)));
        a.close();
        // The ready one still goes to a block; none is made after it.
        assert_eq!(a.take("d:6714", 10), (Some(caps(1)), false));
        assert_eq!(a.take("d:6714", 10), (None, false));
    }

    #[test]
    fn a_ready_one_goes_to_the_next_block_of_its_size_and_depot() {
        let a = Ahead::default();
        a.arm(2);
        // The first block: none ready, one asked for; a second one asked
        // for by the next block; the third waits for them (depth 2).
        assert_eq!(a.take("d:6714", 10), (None, true));
        assert_eq!(a.take("d:6714", 10), (None, true));
        assert_eq!(a.take("d:6714", 10), (None, false));
        a.arrived("d:6714", Some(caps(1)));
        a.arrived("d:6714", None);
        // A block of another size (the last) or depot takes none.
        assert_eq!(a.take("d:6714", 4), (None, false));
        assert_eq!(a.take("e:6714", 10), (None, true));
        let (got, more) = a.take("d:6714", 10);
        assert_eq!(got, Some(caps(1)));
        assert!(more);
        // Arriving after the close, it is not kept (the ledger has it).
        a.close();
        a.arrived("d:6714", Some(caps(2)));
        assert_eq!(a.take("d:6714", 10), (None, false));
    }
}
