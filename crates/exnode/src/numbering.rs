//! How the LoRS 0.82 tools number an exNode's mappings, so that `lors ls`
//! and `lors_ls` show the same index for the same mapping and
//! `lors trim -m N` removes what `lors_trim -m N` removes.
//!
//! `lors_ls` and `lors_trim` do not number mappings in file order. LoRS keeps
//! them in a red-black tree (Jim Plank's libfdr `jrb`) keyed by exNode offset
//! with a *descending* comparator; reading a file inserts the mappings in
//! document order; `lorsQuery` walks that tree backwards (ascending offsets)
//! inserting each mapping into a second tree of the same kind; and the
//! listing walks the second tree backwards again. Distinct offsets therefore
//! come out ascending, but replicas sharing an offset come out in whatever
//! order the tree's shape gives them: a new key equal to one already present
//! is inserted just before the equal node the search meets first, and which
//! one that is depends on the tree's rebalancing history. The only faithful
//! way to reproduce it is to replay the same insertions on a tree that
//! rebalances exactly as libfdr's does, as the private `Jrb` here does
//! (insertion only: numbering never deletes).
//!
//! ```
//! use lors_exnode::{Mapping, Numbering};
//! let at = |exnode_offset| Mapping { exnode_offset, logical_length: 10, ..Default::default() };
//! // In file order: offsets 20, 0, 10.
//! let n = Numbering::of(&[at(20), at(0), at(10)]);
//! assert_eq!(n.number(1), 0); // offset 0 is listed first
//! assert_eq!(n.index(2), Some(0)); // and offset 20 last
//! ```

use std::cmp::Ordering;

use crate::Mapping;

/// The LoRS tools' numbering of a list of mappings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Numbering {
    /// File index of the mapping numbered `n`.
    by_number: Vec<usize>,
    /// Number of the mapping at file index `i`.
    number_of: Vec<usize>,
}

impl Numbering {
    /// Numbers `mappings` (in file order) as `lors_ls` does. Mappings
    /// `lors_ls` leaves out (empty ones at or past the end of the file) are
    /// numbered after all the others, in file order.
    pub fn of(mappings: &[Mapping]) -> Self {
        let key = |m: &Mapping| i64::try_from(m.exnode_offset).unwrap_or(i64::MAX);
        let mut file = Jrb::default();
        let mut length: i64 = 0;
        for (i, m) in mappings.iter().enumerate() {
            file.insert(key(m), i);
            let end = i64::try_from(m.logical_end()).unwrap_or(i64::MAX);
            length = length.max(end);
        }
        // lorsQuery(exnode, 0, logical_length): skips what starts at or after
        // the end and what ends at or before offset 0.
        let mut set = Jrb::default();
        for i in file.backwards() {
            let m = &mappings[i];
            let start = key(m);
            let end = i64::try_from(m.logical_end()).unwrap_or(i64::MAX);
            if (length > 0 && length <= start) || end <= 0 {
                continue;
            }
            set.insert(start, i);
        }
        let mut by_number: Vec<usize> = set.backwards().collect();
        let mut listed = vec![false; mappings.len()];
        for &i in &by_number {
            listed[i] = true;
        }
        by_number.extend((0..mappings.len()).filter(|&i| !listed[i]));
        let mut number_of = vec![0; mappings.len()];
        for (n, &i) in by_number.iter().enumerate() {
            number_of[i] = n;
        }
        Numbering {
            by_number,
            number_of,
        }
    }

    /// `extra` more allocations (an exNode's parity blocks) numbered
    /// after the mappings, in file order: the LoRS tools never list them,
    /// so their numbers stay as they were.
    pub fn then(mut self, extra: usize) -> Self {
        let n = self.number_of.len();
        self.by_number.extend(n..n + extra);
        self.number_of.extend(n..n + extra);
        self
    }

    /// The number shown for the mapping at file index `index`.
    ///
    /// # Panics
    /// If `index` is out of range.
    pub fn number(&self, index: usize) -> usize {
        self.number_of[index]
    }

    /// The file index of the mapping numbered `number`, if there is one.
    pub fn index(&self, number: usize) -> Option<usize> {
        self.by_number.get(number).copied()
    }

    /// File indices in numbering order (the order `lors_ls` lists them).
    pub fn in_order(&self) -> impl Iterator<Item = usize> + '_ {
        self.by_number.iter().copied()
    }
}

/// LoRS's comparator for exNode offsets (`ll_jvalcmp`): larger first.
fn compare(a: i64, b: i64) -> Ordering {
    b.cmp(&a)
}

const HEAD: usize = 0;

/// One node of [`Jrb`]. As in libfdr, external nodes hold the keys and form
/// a sorted circular list through `flink`/`blink` (with the head as
/// sentinel); internal nodes use `flink`/`blink` as their left and right
/// children and `lext` as the last external node of their left subtree.
#[derive(Debug, Clone, Copy, Default)]
struct Node {
    red: bool,
    internal: bool,
    left: bool,
    root: bool,
    head: bool,
    flink: usize,
    blink: usize,
    parent: usize,
    lext: usize,
    key: i64,
    val: usize,
}

/// libfdr's red-black tree, insertion only, rebalancing node for node as
/// the C code does (the shape decides where equal keys go).
#[derive(Debug)]
struct Jrb {
    n: Vec<Node>,
}

impl Default for Jrb {
    fn default() -> Self {
        Jrb {
            n: vec![Node {
                head: true,
                ..Node::default()
            }],
        }
    }
}

impl Jrb {
    /// Values from the last external node to the first (`jrb_rtraverse`).
    fn backwards(&self) -> impl Iterator<Item = usize> + '_ {
        let mut at = self.n[HEAD].blink;
        std::iter::from_fn(move || {
            if at == HEAD {
                return None;
            }
            let v = self.n[at].val;
            at = self.n[at].blink;
            Some(v)
        })
    }

    fn insert(&mut self, key: i64, val: usize) {
        let at = self.find_gte(key);
        self.insert_before(at, key, val);
    }

    /// The external node equal to `key` the search meets first, else the
    /// first one after it, else the head.
    fn find_gte(&self, key: i64) -> usize {
        let n = &self.n;
        if n[HEAD].parent == HEAD {
            return HEAD;
        }
        let last = n[HEAD].blink;
        match compare(key, n[last].key) {
            Ordering::Equal => return last,
            Ordering::Greater => return HEAD,
            Ordering::Less => {}
        }
        let mut x = n[HEAD].parent;
        loop {
            if !n[x].internal {
                return x;
            }
            let l = n[x].lext;
            match compare(key, n[l].key) {
                Ordering::Equal => return l,
                Ordering::Less => x = n[x].flink,
                Ordering::Greater => x = n[x].blink,
            }
        }
    }

    fn new_external(&mut self, key: i64, val: usize) -> usize {
        self.n.push(Node {
            key,
            val,
            ..Node::default()
        });
        self.n.len() - 1
    }

    /// Links `item` into the sorted list just before `next`.
    fn link_before(&mut self, item: usize, next: usize) {
        let prev = self.n[next].blink;
        self.n[next].blink = item;
        self.n[prev].flink = item;
        self.n[item].blink = prev;
        self.n[item].flink = next;
    }

    fn insert_before(&mut self, at: usize, key: i64, val: usize) {
        if at == HEAD {
            if self.n[HEAD].parent == HEAD {
                let new = self.new_external(key, val);
                self.link_before(new, HEAD);
                self.n[HEAD].parent = new;
                self.n[new].parent = HEAD;
                self.n[new].root = true;
                return;
            }
            let right = self.new_external(key, val);
            self.link_before(right, HEAD);
            let left = self.n[right].blink;
            self.n[left].root = false;
            let (p, il) = (self.n[left].parent, self.n[left].left);
            self.new_internal(left, right, p, il);
            let p = self.rprev(right);
            if p != HEAD {
                self.n[p].lext = right;
            }
        } else {
            let left = self.new_external(key, val);
            self.link_before(left, at);
            self.n[at].root = false;
            let (p, il) = (self.n[at].parent, self.n[at].left);
            self.new_internal(left, at, p, il);
            // libfdr also records the new node as its lprev's right-most
            // external; only deletion reads that, so it is not kept here.
        }
    }

    fn new_internal(&mut self, l: usize, r: usize, p: usize, il: bool) {
        self.n.push(Node {
            red: true,
            internal: true,
            flink: l,
            blink: r,
            parent: p,
            lext: l,
            ..Node::default()
        });
        let new = self.n.len() - 1;
        self.n[l].parent = new;
        self.n[r].parent = new;
        self.n[l].left = true;
        self.n[r].left = false;
        if self.n[p].head {
            self.n[p].parent = new;
            self.n[new].root = true;
        } else if il {
            self.n[new].left = true;
            self.n[p].flink = new;
        } else {
            self.n[new].left = false;
            self.n[p].blink = new;
        }
        self.recolor(new);
    }

    /// The nearest ancestor whose right subtree holds `x` (or the head).
    fn rprev(&self, mut x: usize) -> usize {
        while !self.n[x].root {
            if self.n[x].left {
                return self.n[x].parent;
            }
            x = self.n[x].parent;
        }
        self.n[x].parent
    }

    fn sibling(&self, x: usize) -> usize {
        let p = self.n[x].parent;
        if self.n[x].left {
            self.n[p].blink
        } else {
            self.n[p].flink
        }
    }

    fn recolor(&mut self, mut x: usize) {
        let (p, gp) = loop {
            if self.n[x].root {
                self.n[x].red = false;
                return;
            }
            let p = self.n[x].parent;
            if !self.n[p].red {
                return;
            }
            if self.n[p].root {
                self.n[p].red = false;
                return;
            }
            let gp = self.n[p].parent;
            let s = self.sibling(p);
            if self.n[s].red {
                self.n[p].red = false;
                self.n[gp].red = true;
                self.n[s].red = false;
                x = gp;
            } else {
                break (p, gp);
            }
        };
        if self.n[x].left == self.n[p].left {
            self.rotate(gp, self.n[x].left);
            self.n[p].red = false;
            self.n[gp].red = true;
        } else {
            self.rotate(p, self.n[x].left);
            // The first rotation moved `x` to `p`'s side: read it again.
            self.rotate(gp, self.n[x].left);
            self.n[x].red = false;
            self.n[gp].red = true;
        }
    }

    /// Rotates `y`'s left child up (`l`) or its right child.
    fn rotate(&mut self, y: usize, l: bool) {
        let is_root = self.n[y].root;
        let yp = self.n[y].parent;
        let was_left = !is_root && self.n[y].left;
        let x = if l {
            let x = self.n[y].flink;
            let c = self.n[x].blink;
            self.n[y].flink = c;
            self.n[c].left = true;
            self.n[c].parent = y;
            self.n[x].blink = y;
            self.n[y].left = false;
            x
        } else {
            let x = self.n[y].blink;
            let c = self.n[x].flink;
            self.n[y].blink = c;
            self.n[c].left = false;
            self.n[c].parent = y;
            self.n[x].flink = y;
            self.n[y].left = true;
            x
        };
        self.n[x].parent = yp;
        self.n[y].parent = x;
        if is_root {
            self.n[yp].parent = x;
            self.n[y].root = false;
            self.n[x].root = true;
        } else if was_left {
            self.n[yp].flink = x;
            self.n[x].left = true;
        } else {
            self.n[yp].blink = x;
            self.n[x].left = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mappings(offsets: &[u64]) -> Vec<Mapping> {
        offsets
            .iter()
            .map(|&exnode_offset| Mapping {
                exnode_offset,
                logical_length: 10,
                ..Default::default()
            })
            .collect()
    }

    fn order(ms: &[Mapping]) -> Vec<usize> {
        Numbering::of(ms).in_order().collect()
    }

    // Known answers below come from the reference: libfdr's jrb driving
    // LoRS 0.82's lorsDeserialize → lorsQuery → lorsSetEnum, compiled and
    // compared with this port on 3,000 generated exNodes (replica layouts,
    // LoRS's descending files, all-equal offsets, empty mappings, up to
    // 1,000 mappings); every order matched.

    #[test]
    fn replicas_tie_as_the_reference_tree_leaves_them() {
        let offs = [2, 1, 1, 0, 2, 1, 0, 0, 2];
        assert_eq!(order(&mappings(&offs)), [3, 6, 7, 1, 5, 2, 0, 4, 8]);
        let offs = [
            10, 10, 20, 30, 0, 0, 30, 20, 10, 10, 30, 30, 30, 10, 10, 10, 30, 0, 0, 10,
        ];
        assert_eq!(
            order(&mappings(&offs)),
            [
                4, 5, 17, 18, 0, 1, 8, 9, 19, 13, 14, 15, 2, 7, 3, 6, 10, 11, 12, 16
            ]
        );
    }

    #[test]
    fn common_layouts_keep_file_order_among_replicas() {
        // Copies adjacent (our uploads), copy after copy (augment), and
        // descending with adjacent copies (files lors_upload writes).
        assert_eq!(
            order(&mappings(&[0, 0, 10, 10, 20, 20])),
            [0, 1, 2, 3, 4, 5]
        );
        assert_eq!(
            order(&mappings(&[0, 10, 20, 0, 10, 20])),
            [0, 3, 1, 4, 2, 5]
        );
        assert_eq!(
            order(&mappings(&[20, 20, 10, 10, 0, 0])),
            [4, 5, 2, 3, 0, 1]
        );
        assert_eq!(order(&mappings(&[0; 8])), [0, 1, 2, 3, 4, 5, 6, 7]);
    }

    #[test]
    fn mappings_lors_ls_leaves_out_come_last() {
        let at = |exnode_offset, logical_length| Mapping {
            exnode_offset,
            logical_length,
            ..Default::default()
        };
        // The reference lists 0, 2, 3; the empty mapping at the end is not
        // listed, so it takes the next free number.
        let ms = [at(0, 10), at(10, 0), at(0, 10), at(5, 0)];
        assert_eq!(order(&ms), [0, 2, 3, 1]);
    }

    #[test]
    fn distinct_offsets_are_numbered_ascending_whatever_the_file_order() {
        let n = Numbering::of(&mappings(&[30, 10, 0, 20]));
        assert_eq!(n.in_order().collect::<Vec<_>>(), [2, 1, 3, 0]);
        assert_eq!(n.number(0), 3);
        assert_eq!(n.index(4), None);
    }
}
