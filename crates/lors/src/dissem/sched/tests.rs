use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::*;

/// Runs `s` to the end: a transfer to site `i` takes `len / rate[i]`
/// seconds (links not shared: enough to check decisions, not timing);
/// `fail(t)` says whether a transfer fails and whose fault it is.
fn run(
    s: &mut Sched,
    rate: &[f64],
    mut fail: impl FnMut(&Transfer) -> Option<Blame>,
) -> (Vec<Transfer>, Duration) {
    let t0 = Instant::now();
    let mut heap = BinaryHeap::new();
    let mut all = Vec::new();
    let mut now = t0;
    let mut live: HashMap<u64, Transfer> = HashMap::new();
    loop {
        for t in s.next(now) {
            let secs = s.lens[t.block] as f64 / rate[t.to];
            heap.push(Reverse((now + Duration::from_secs_f64(secs), t.id)));
            live.insert(t.id, t);
            all.push(t);
        }
        let Some(Reverse((at, id))) = heap.pop() else {
            break;
        };
        now = at;
        let Some(t) = live.remove(&id) else {
            continue; // made void by a dropped site
        };
        match fail(&t) {
            Some(Blame::Busy { to }) => s.busy(id, to, now),
            Some(b) => {
                for v in s.failed(id, b) {
                    live.remove(&v);
                }
            }
            None => s.done(id, now),
        }
        assert!(all.len() < 100_000, "runs away");
    }
    (all, now - t0)
}

#[test]
fn every_site_gets_every_block_and_the_source_sends_each_about_once() {
    let n = 6;
    let lens = vec![100u64; 60];
    let mut s = Sched::new(lens, n, None, None, &[]);
    let (all, _) = run(&mut s, &[1000.0; 6], |_| None);
    assert!(s.finished());
    for i in 0..n {
        assert!(s.is_complete(i), "site {i}");
    }
    let from_client = all.iter().filter(|t| t.from == Source::Client).count();
    assert_eq!(from_client, 60, "each block leaves the source once");
    assert_eq!(s.client_bytes(), 6000);
    // The other copies are relays, spread over the sites (in this model
    // without shared links the first holders can serve everyone).
    assert_eq!(all.len() - from_client, 60 * (n - 1));
    let relaying = (0..n)
        .filter(|&i| all.iter().any(|t| t.from == Source::Site(i)))
        .count();
    assert!(relaying >= n / 2, "{relaying} of {n} sites relay");
    // No site receives a block twice.
    let mut seen = std::collections::HashSet::new();
    assert!(all.iter().all(|t| seen.insert((t.to, t.block))));
}

#[test]
fn unicast_sends_everything_from_the_source() {
    let cfg = Config {
        relay: false,
        client_slots: 8,
        ..Config::default()
    };
    let mut s = Sched::new(vec![10; 20], 4, Some(cfg), None, &[]);
    let (all, _) = run(&mut s, &[1000.0; 4], |_| None);
    assert!(s.finished());
    assert_eq!(all.len(), 80);
    assert!(all.iter().all(|t| t.from == Source::Client));
    assert_eq!(s.client_bytes(), 800);
}

#[test]
fn a_site_that_keeps_failing_is_dropped_and_the_others_finish() {
    let mut s = Sched::new(vec![10; 30], 4, None, None, &[]);
    let mut dropped = false;
    let (_, _) = run(&mut s, &[1000.0; 4], |t| (t.to == 2).then_some(Blame::To));
    for n in s.take_notes() {
        dropped |= n
            == Note::SiteDropped {
                site: 2,
                failures: 3,
            };
    }
    assert!(dropped, "site 2 dropped");
    assert!(s.is_dropped(2));
    assert!(s.finished());
    for i in [0, 1, 3] {
        assert!(s.is_complete(i), "site {i}");
    }
}

#[test]
fn a_source_site_that_dies_mid_run_leaves_its_blocks_to_others() {
    // Site 0 receives fine, then every copy from it fails (its depot is
    // gone): it is dropped, and the blocks only it had come from the source
    // again.
    let mut s = Sched::new(vec![10; 40], 3, None, None, &[]);
    let mut done_to_0 = 0;
    run(&mut s, &[1000.0; 3], |t| {
        if t.to == 0 {
            done_to_0 += 1;
            return (done_to_0 > 5).then_some(Blame::To);
        }
        (t.from == Source::Site(0)).then_some(Blame::Both)
    });
    assert!(s.is_dropped(0));
    assert!(s.finished());
    assert!(s.is_complete(1) && s.is_complete(2));
}

#[test]
fn a_busy_site_gets_fewer_slots_and_is_never_dropped_for_it() {
    let lens = vec![100u64; 60];
    let cfg = Config {
        in_slots: 16,
        out_slots: 16,
        ..Config::default()
    };
    let mut s = Sched::new(lens, 3, Some(cfg), None, &[]);
    let mut refusals = 0;
    // Site 0 refuses its first 40 copies, as a depot at its per-client cap.
    let (_, _) = run(&mut s, &[1000.0; 3], |t| {
        (t.to == 0 && refusals < 40).then(|| {
            refusals += 1;
            Blame::Busy { to: true }
        })
    });
    assert!(s.finished());
    for i in 0..3 {
        assert!(s.is_complete(i), "site {i}");
    }
    assert!(!(s.take_notes().iter()).any(|n| matches!(n, Note::SiteDropped { .. })));
    assert!(
        s.in_slots(0) < 16 && s.in_slots(0) >= 1,
        "{}",
        s.in_slots(0)
    );
    assert_eq!(s.in_slots(1), 16);
}

#[test]
fn a_site_that_cannot_send_still_gets_its_replica() {
    // Every copy from site 1 fails on its side (a slow uplink timing out):
    // it stops being a source, and it is neither dropped nor short.
    let mut s = Sched::new(vec![10; 40], 3, None, None, &[]);
    run(&mut s, &[1000.0; 3], |t| {
        (t.from == Source::Site(1)).then_some(Blame::From)
    });
    assert!(!s.is_dropped(1));
    assert!(s.finished());
    for i in 0..3 {
        assert!(s.is_complete(i), "site {i}");
    }
}

#[test]
fn blocks_on_origins_are_relayed_from_there_not_from_the_client() {
    // Two origins, each block on one of them.
    let origins: Vec<Vec<usize>> = (0..16).map(|b| vec![b % 2]).collect();
    let mut s = Sched::new(vec![10; 16], 3, None, Some(&origins), &[]);
    let (all, _) = run(&mut s, &[1000.0; 3], |_| None);
    assert!(s.finished());
    assert!((0..3).all(|i| s.is_complete(i)));
    assert!(all.iter().all(|t| t.from != Source::Client));
    // Each block leaves its origin about once; the sites relay the rest.
    let from_origins = all
        .iter()
        .filter(|t| matches!(t.from, Source::Origin(_)))
        .count();
    assert!(
        from_origins < 16 * 2,
        "origins sent {from_origins} of 48 copies"
    );
    assert_eq!(s.client_bytes(), 0);
}

#[test]
fn what_sites_hold_already_is_not_sent_again() {
    let preheld: Vec<(SiteId, BlockId)> = (0..10).map(|b| (0, b)).chain([(1, 3)]).collect();
    let mut s = Sched::new(vec![10; 10], 2, None, None, &preheld);
    let (all, _) = run(&mut s, &[1000.0; 2], |_| None);
    assert!(s.finished() && s.is_complete(0) && s.is_complete(1));
    assert_eq!(all.len(), 9, "only site 1's missing blocks: {all:?}");
    assert!(all.iter().all(|t| t.to == 1 && t.from == Source::Site(0)));
}

#[test]
fn a_slow_site_is_fed_by_relays_not_by_the_source() {
    let n = 5;
    let mut s = Sched::new(vec![100; 200], n, None, None, &[]);
    let rates = [1000.0, 1000.0, 1000.0, 1000.0, 100.0];
    let (all, _) = run(&mut s, &rates, |_| None);
    assert!((0..n).all(|i| s.is_complete(i)));
    let to_slow_from_client = (all.iter())
        .filter(|t| t.to == 4 && t.from == Source::Client)
        .count();
    // Before its rate is known it may take a few; then none.
    assert!(
        to_slow_from_client <= 4,
        "{to_slow_from_client} blocks from the source"
    );
    let client = all.iter().filter(|t| t.from == Source::Client).count();
    assert!(
        client <= 200 + 8,
        "source egress stays near the file: {client} blocks"
    );
}

#[test]
fn nothing_to_do_when_no_one_can_give_a_block() {
    // Block 1's only origin is given up: the run ends with it unreachable.
    let origins = vec![vec![0], vec![1]];
    let cfg = Config {
        max_failures: 1,
        ..Config::default()
    };
    let mut s = Sched::new(vec![10, 10], 2, Some(cfg), Some(&origins), &[]);
    run(&mut s, &[1000.0; 2], |t| {
        (t.from == Source::Origin(1)).then_some(Blame::From)
    });
    assert!(s.finished());
    assert_eq!(s.unreachable(), vec![1]);
    assert_eq!(s.take_notes(), vec![Note::OriginDropped { origin: 1 }]);
    assert!(!s.is_complete(0) && s.held(0) == 1);
}

#[test]
fn deadlines_follow_the_typical_transfer() {
    let mut s = Sched::new(vec![1000; 4], 1, None, None, &[]);
    let floor = Duration::from_secs(5);
    assert_eq!(s.deadline(1000, floor), floor);
    let now = Instant::now();
    let t = s.next(now);
    for x in &t {
        s.done(x.id, now + Duration::from_secs(10));
    }
    // 10 s per 1000 bytes: eight times that.
    assert_eq!(s.deadline(1000, floor).as_secs(), 80);
}
