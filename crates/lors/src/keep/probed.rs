//! Probes of a batch of exNodes taken together, before a keeper keeps
//! them one by one: a depot that does not answer costs one stall for the
//! batch, not one per file.

use std::collections::HashMap;

use lors_exnode::ExNode;

use crate::commit::key;
use crate::manage::{self, Probe};
use crate::pool::Pool;

/// What the depots said of each allocation of a batch, by capability.
#[derive(Debug, Default)]
pub struct Probed(HashMap<String, Probe>);

impl Probed {
    /// Nothing probed yet: [`super::cycle`] probes each file itself.
    pub fn none() -> Self {
        Probed::default()
    }

    /// Probes every allocation of `xs` at once ([`manage::probe_many`]).
    ///
    /// ```no_run
    /// # async fn f(a: lors_exnode::ExNode, b: lors_exnode::ExNode, pool: lors::Pool) {
    /// let probed = lors::keep::Probed::of(&[&a, &b], &pool).await;
    /// # }
    /// ```
    pub async fn of(xs: &[&ExNode], pool: &Pool) -> Self {
        let probes = manage::probe_many(xs, pool).await;
        let mut by_key = HashMap::new();
        for (x, ps) in xs.iter().zip(probes) {
            for (m, p) in x.allocations().zip(ps) {
                if let Some(k) = key(m) {
                    by_key.insert(k, p);
                }
            }
        }
        Probed(by_key)
    }

    /// `x`'s probes: from the batch when it saw every allocation (the
    /// file unchanged since), else asked now.
    pub(super) async fn of_exnode(&self, x: &ExNode, pool: &Pool) -> Vec<Probe> {
        let cached: Option<Vec<Probe>> = (x.allocations())
            .map(|m| key(m).and_then(|k| self.0.get(&k).cloned()))
            .collect();
        match cached {
            Some(p) => p,
            None => manage::probe_all(x, pool).await,
        }
    }
}
