//! The depot's command handling, not only its parser: a real depot on
//! 127.0.0.1 with its store in a temporary directory, driven by sequences of
//! commands built from the input — ALLOCATE, STORE, WRITE, LOAD (plain and
//! with LStore's network checksums, right or wrong), SEND, MANAGE, STATUS,
//! LStore's alias ALLOCATE and MANAGE and disk-checksummed ALLOCATE (whose
//! keys are then used everywhere), GET and VALIDATE checksum, with numbers
//! at their extremes, zero-length and past-the-end WRITEs, tiny checksum
//! blocks, checksummed queues, data phases cut short or raced by a DECR that
//! deletes their allocation, and raw lines. After every input:
//!
//! * every reply came within its deadline (no hang), and the depot answers;
//! * the bytes an owner stored before handing out an alias for the window
//!   after them are intact, and the whole allocation reads back, whatever
//!   was done through the alias's keys;
//! * the space the depot accounts equals the sum of its live allocations and
//!   stays within the resource, and no allocation holds more than its max
//!   size;
//! * once every allocation is gone, the accounting is back to zero and no
//!   data file is left on disk.
#![no_main]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use libfuzzer_sys::arbitrary::{Result as ArbResult, Unstructured};
use libfuzzer_sys::fuzz_target;
use lors_depot::Depot;
use lors_depot::config::{ByteSize, Config, ResourceConfig, Span, SyncPolicy};
use lors_ibp::proto::chksum::{ChksumType, NetChksum, frame};

const RESOURCE: u64 = 16 << 20;
/// Longest wait for any reply; the depot's own deadlines are 1 s.
const REPLY_WITHIN: Duration = Duration::from_secs(10);

struct Harness {
    _rt: tokio::runtime::Runtime,
    depot: Arc<Depot>,
    addr: String,
    data: PathBuf,
    _dir: tempfile::TempDir,
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut r = ResourceConfig::new("1", dir.path().join("r1"));
        r.size = ByteSize(RESOURCE);
        r.max_queue_size = ByteSize(1 << 20);
        r.max_duration = Span(Duration::from_secs(3600));
        let cfg = Config {
            listen: "127.0.0.1:0".parse().unwrap(),
            io_timeout: Span(Duration::from_secs(1)),
            idle_timeout: Span(Duration::from_secs(5)),
            max_client_timeout: Span(Duration::from_secs(1)),
            buffer_memory: ByteSize(8 << 20),
            sync: SyncPolicy::Never,
            resources: vec![r],
            ..Config::default()
        };
        let (depot, addr) = rt.block_on(async {
            let depot = Depot::open(cfg).await.unwrap();
            let l = depot.bind().await.unwrap();
            let addr = l.ibp.local_addr().unwrap().to_string();
            let (tx, rx) = tokio::sync::watch::channel(false);
            std::mem::forget(tx); // serve for the life of the process
            tokio::spawn(lors_depot::server::run(l, depot.clone(), rx));
            (depot, addr)
        });
        Harness {
            _rt: rt,
            depot,
            addr,
            data: dir.path().join("r1").join("data"),
            _dir: dir,
        }
    })
}

/// A client connection with deadlines; `None` once the depot closed it.
struct Client {
    rd: BufReader<TcpStream>,
}

impl Client {
    fn connect(addr: &str) -> Client {
        let s = TcpStream::connect(addr).expect("depot accepts");
        s.set_read_timeout(Some(REPLY_WITHIN)).unwrap();
        s.set_write_timeout(Some(REPLY_WITHIN)).unwrap();
        Client {
            rd: BufReader::new(s),
        }
    }

    fn send(&mut self, b: &[u8]) -> bool {
        self.rd.get_mut().write_all(b).is_ok()
    }

    /// The next reply line; `None` at EOF or reset. A timeout is a hang.
    fn line(&mut self) -> Option<String> {
        let mut s = String::new();
        match self.rd.read_line(&mut s) {
            Ok(0) => None,
            Ok(_) => Some(s),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                panic!("no reply within {REPLY_WITHIN:?}: the depot hung")
            }
            Err(_) => None,
        }
    }

    fn skip(&mut self, n: u64) -> bool {
        let mut left = n;
        let mut buf = [0u8; 65536];
        while left > 0 {
            let want = usize::try_from(left.min(buf.len() as u64)).unwrap();
            match self.rd.read(&mut buf[..want]) {
                Ok(0) | Err(_) => return false,
                Ok(k) => left -= k as u64,
            }
        }
        true
    }
}

/// `FUZZ_DEBUG=1` prints every request and reply (to replay an artifact:
/// `FUZZ_DEBUG=1 fuzz/target/*/release/depot_commands ARTIFACT`).
fn trace() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("FUZZ_DEBUG").is_some())
}

/// A number from the wire, biased to the edges.
fn num(u: &mut Unstructured<'_>) -> ArbResult<String> {
    Ok(match u.int_in_range(0u8..=11)? {
        0 => "0".into(),
        1 => "1".into(),
        2 => (u64::MAX - 1).to_string(),
        3 => u64::MAX.to_string(),
        4 => i64::MAX.to_string(),
        5 => "-1".into(),
        6 => i64::MIN.to_string(),
        7 => RESOURCE.to_string(),
        8 => (RESOURCE + 1).to_string(),
        9 => u16::from(u.arbitrary::<u8>()?).to_string(),
        10 => u.arbitrary::<u16>()?.to_string(),
        _ => u.arbitrary::<u64>()?.to_string(),
    })
}

/// Mostly a plausible number below `typical_max`, else one at an edge: deep
/// paths need commands that succeed, the edges need to be tried everywhere.
fn plain(u: &mut Unstructured<'_>, typical_max: u64) -> ArbResult<String> {
    if u.ratio(1u8, 4)? {
        num(u)
    } else {
        Ok(u.int_in_range(1..=typical_max)?.to_string())
    }
}

/// One allocation's three `key typekey` tokens.
#[derive(Clone)]
struct Caps([String; 3]);

fn parse_caps(reply: &str) -> Option<Caps> {
    let mut toks = Vec::new();
    for cap in reply.split_whitespace().skip(1) {
        // ibp://host:port/RID#KEY/TYPEKEY/KIND
        let mut parts = cap.rsplitn(4, '/');
        let _kind = parts.next()?;
        let typekey = parts.next()?;
        let key = parts.next()?;
        toks.push(format!("{key} {typekey}"));
    }
    let [r, w, m]: [String; 3] = toks.try_into().ok()?;
    Some(Caps([r, w, m]))
}

/// The owner's bytes of the guarded allocation, before its alias's window.
const GUARDED: usize = 1000;

fn guarded_bytes() -> Vec<u8> {
    (0..GUARDED).map(|i| (i % 251) as u8).collect()
}

/// An allocation whose owner stored [`GUARDED`] bytes and handed out an
/// alias for the 4096 bytes after them: the alias's keys join the pool, the
/// owner's do not.
fn guard(c: &mut Client) -> (Caps, Caps) {
    assert!(c.send(b"1 1 1 2 1 600 65536 10\n"));
    let reply = c.line().expect("ALLOCATE reply");
    let owner = parse_caps(&reply).unwrap_or_else(|| panic!("ALLOCATE: {reply:?}"));
    assert!(c.send(format!("1 2 {} {GUARDED} 10\n", owner.0[1]).as_bytes()));
    assert_eq!(c.line().as_deref(), Some("1 \n"));
    assert!(c.send(&guarded_bytes()));
    assert_eq!(c.line(), Some(format!("1 {GUARDED} \n")));
    assert!(c.send(format!("1 14 {} {GUARDED} 4096 0 10\n", owner.0[2]).as_bytes()));
    let reply = c.line().expect("ALIAS_ALLOCATE reply");
    let alias = parse_caps(&reply).unwrap_or_else(|| panic!("ALIAS_ALLOCATE: {reply:?}"));
    (owner, alias)
}

/// The owner's bytes are intact and every byte the allocation says it holds
/// is there to read.
fn check_guard(h: &Harness, owner: &Caps) {
    let mut c = Client::connect(&h.addr);
    assert!(c.send(format!("1 9 {} 40 0 0 0 0 10\n", owner.0[2]).as_bytes()));
    let probe = c.line().expect("PROBE reply");
    let f: Vec<u64> = probe
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    assert!(f.len() == 8 && f[0] == 1, "the owner's PROBE: {probe:?}");
    let size = f[3];
    assert!(size >= GUARDED as u64, "the owner's bytes were cut: {probe:?}");
    assert!(c.send(format!("1 8 {} 0 {size} 10\n", owner.0[0]).as_bytes()));
    assert_eq!(c.line(), Some(format!("1 {size} \n")), "LOAD of {size}");
    let mut all = vec![0u8; usize::try_from(size).unwrap()];
    c.rd.read_exact(&mut all)
        .unwrap_or_else(|e| panic!("{size} bytes promised, not sent: {e}"));
    assert_eq!(&all[..GUARDED], &guarded_bytes()[..], "the owner's bytes changed");
}

fn run(u: &mut Unstructured<'_>, h: &Harness) {
    let mut c = Client::connect(&h.addr);
    let (owner, alias) = guard(&mut c);
    let _ = steps(u, h, c, alias);
    check_guard(h, &owner);
}

fn steps(u: &mut Unstructured<'_>, h: &Harness, mut c: Client, alias: Caps) -> ArbResult<()> {
    let mut caps: Vec<Caps> = vec![alias];
    let mut full_caps: Vec<String> = Vec::new();
    // Start from live allocations of each kind, so the input's commands
    // reach real data phases and accounting at once.
    for (rel, ty, size) in [
        (2, 1, 64 << 10),
        (1, 1, 1 << 20),
        (2, 3, 4096),
        (2, 4, 4096),
    ] {
        assert!(c.send(format!("1 1 1 {rel} {ty} 600 {size} 10\n").as_bytes()));
        let reply = c.line().expect("ALLOCATE reply");
        caps.push(parse_caps(&reply).unwrap_or_else(|| panic!("ALLOCATE: {reply:?}")));
        full_caps.push(reply.split_whitespace().nth(2).unwrap_or("").to_owned());
    }
    let mut steps = 0;
    while !u.is_empty() && steps < 48 {
        steps += 1;
        let pick = |u: &mut Unstructured<'_>, caps: &[Caps], k: usize| -> ArbResult<String> {
            if caps.is_empty() {
                return Ok("1#nosuchkey 1".into());
            }
            Ok(caps[u.choose_index(caps.len())?].0[k].clone())
        };
        let ver = if u.ratio(1u8, 8)? { 0 } else { 1 };
        let t = plain(u, 30)?; // the timeout field
        let op = u.int_in_range(0u8..=15)?;
        // LStore's checksummed forms of STORE, WRITE and LOAD, sometimes
        // with types or block sizes the depot must refuse.
        let chk = if u.ratio(1u8, 4)? {
            Some(([1, 2, 3, 4, 0, 9][u.choose_index(6)?], plain(u, 64 << 10)?))
        } else {
            None
        };
        let ncs = chk.as_ref().and_then(|(k, bs)| {
            Some(NetChksum {
                kind: ChksumType::from_number(*k)?,
                block_size: bs.parse().ok().filter(|&b| b >= 1)?,
            })
        });
        let head = |plain: u8, checksummed: u8| match &chk {
            None => format!("{ver} {plain}"),
            Some((k, bs)) => format!("{ver} {checksummed} {k} {bs}"),
        };
        let (line, data_len): (String, Option<u64>) = match op {
            0 => {
                let rid = if u.ratio(1u8, 8)? { "9" } else { "1" };
                let rel = if u.ratio(1u8, 8)? {
                    0
                } else {
                    u.int_in_range(1u8..=2)?
                };
                let ty = [1, 1, 1, 3, 4, 2, 0][u.choose_index(7)?];
                let (d, s) = (plain(u, 3600)?, plain(u, 4 << 20)?);
                (format!("{ver} 1 {rid} {rel} {ty} {d} {s} {t}"), None)
            }
            1 | 2 => {
                let w = pick(u, &caps, 1)?;
                let len = plain(u, 256 << 10)?;
                let line = if op == 1 {
                    format!("{} {w} {len} {t}", head(2, 28))
                } else {
                    // Zero-length and past-the-end WRITEs often: the
                    // committed length must never move without bytes.
                    let len = if u.ratio(1u8, 4)? { "0".into() } else { len };
                    let off = if u.ratio(1u8, 4)? {
                        (4096 + u64::from(u.arbitrary::<u16>()?)).to_string()
                    } else {
                        plain(u, 1 << 20)?
                    };
                    format!("{} {w} {off} {len} {t}", head(13, 27))
                };
                let len = line.split_whitespace().nth_back(1).and_then(|x| x.parse().ok());
                (line, len)
            }
            3 => {
                let r = pick(u, &caps, 0)?;
                let (off, len) = (plain(u, 1 << 20)?, plain(u, 256 << 10)?);
                (format!("{} {r} {off} {len} {t}", head(8, 24)), None)
            }
            4 => {
                let m = pick(u, &caps, 2)?;
                let sub = [40, 41, 42, 43, 45, 44][u.choose_index(6)?];
                let line = match sub {
                    41 | 42 => format!("{ver} 9 {m} {sub} {} {t}", u.int_in_range(0u8..=3)?),
                    45 => format!("{ver} 9 {m} 45 {} {t}", plain(u, 8 << 20)?),
                    _ => {
                        let (a, b) = (plain(u, 8 << 20)?, plain(u, 3600)?);
                        let r = if u.ratio(1u8, 4)? {
                            num(u)?
                        } else {
                            "-1".into()
                        };
                        format!("{ver} 9 {m} {sub} 0 {a} {b} {r} {t}")
                    }
                };
                (line, None)
            }
            5 => {
                let r = pick(u, &caps, 0)?;
                let dest = if full_caps.is_empty() {
                    "ibp://127.0.0.1:1/1#x/1/WRITE".to_owned()
                } else {
                    full_caps[u.choose_index(full_caps.len())?].clone()
                };
                let (off, len) = (plain(u, 1 << 20)?, plain(u, 256 << 10)?);
                (format!("{ver} 5 {r} {dest} {off} {len} 1 1 1"), None)
            }
            6 => (format!("1 4 {} 1 ibp {t}", u.int_in_range(0u8..=2)?), None),
            7 => (format!("1 4 {} {t}", [3, 5][u.choose_index(2)?]), None),
            8 => {
                // Raw bytes as a line (the parser's own target covers more).
                let n = u.int_in_range(0usize..=64)?;
                let raw: Vec<u8> = u
                    .bytes(n)?
                    .iter()
                    .map(|&b| if b == b'\n' { b' ' } else { b })
                    .collect();
                (String::from_utf8_lossy(&raw).into_owned(), None)
            }
            10 => {
                // ALIAS_ALLOCATE; its keys join the pool the other commands
                // pick from.
                let k = u.choose_index(3)?;
                let m = pick(u, &caps, k)?;
                let (off, len) = (plain(u, 64 << 10)?, plain(u, 64 << 10)?);
                let (off, len) = if u.ratio(1u8, 2)? {
                    ("0".into(), "0".into())
                } else {
                    (off, len)
                };
                let d = if u.ratio(1u8, 2)? {
                    "0".into()
                } else {
                    plain(u, 3600)?
                };
                (format!("{ver} 14 {m} {off} {len} {d} {t}"), None)
            }
            11 => {
                // ALIAS_MANAGE with any key as the alias and as the master.
                let a = pick(u, &caps, 2)?;
                let m = pick(u, &caps, 2)?;
                let line = match [40, 41, 42, 43, 43][u.choose_index(5)?] {
                    40 => format!("{ver} 15 {a} 40 3 {t}"),
                    43 => {
                        let cap = if u.ratio(1u8, 2)? { "3 " } else { "" };
                        let (off, len) = (plain(u, 64 << 10)?, plain(u, 64 << 10)?);
                        let d = num(u)?;
                        format!("{ver} 15 {a} 43 {cap}{off} {len} {d} {m} {t}")
                    }
                    sub => {
                        let ct = u.int_in_range(0u8..=3)?;
                        format!("{ver} 15 {a} {sub} {ct} {m} {t}")
                    }
                };
                (line, None)
            }
            12 => {
                // ALLOCATE_CHKSUM (its keys join the pool, so STOREs, WRITEs
                // and LOADs reach digest-keeping allocations).
                let kind = [0, 1, 2, 3, 4, 9][u.choose_index(6)?];
                // Tiny blocks often: their digests must stay bounded.
                let bs = if u.ratio(1u8, 3)? {
                    u.int_in_range(1u8..=16)?.to_string()
                } else {
                    plain(u, 64 << 10)?
                };
                let ty = [1, 1, 3][u.choose_index(3)?];
                let (d, sz) = (plain(u, 3600)?, plain(u, 1 << 20)?);
                (format!("{ver} 29 {kind} {bs} 1 2 {ty} {d} {sz} {t}"), None)
            }
            13 => {
                // GET_CHKSUM or VALIDATE_CHKSUM with any key.
                let m = pick(u, &caps, 2)?;
                let c = if u.ratio(1u8, 2)? { 31 } else { 32 };
                (format!("{ver} {c} {m} {} {t}", u.int_in_range(0u8..=1)?), None)
            }
            14 => {
                // A STORE whose allocation is deleted (both counts to zero)
                // on another connection while its bytes arrive.
                if caps.is_empty() {
                    continue;
                }
                let k = u.choose_index(caps.len())?;
                let len = u.int_in_range(1u32..=(256 << 10))?;
                delete_during_store(h, &mut c, &caps[k], len, u.ratio(1u8, 2)?);
                continue;
            }
            _ => {
                // A fresh connection, abandoning this one mid-whatever.
                c = Client::connect(&h.addr);
                continue;
            }
        };
        if !c.send(format!("{line}\n").as_bytes()) {
            c = Client::connect(&h.addr);
            continue;
        }
        let dbg_reply = c.line();
        if trace() {
            eprintln!("{line:?} -> {dbg_reply:?}");
        }
        let Some(reply) = dbg_reply else {
            c = Client::connect(&h.addr);
            continue;
        };
        match op {
            0 | 10 | 12 if reply.starts_with("1 ") => {
                if let Some(cs) = parse_caps(&reply) {
                    full_caps.push(reply.split_whitespace().nth(2).unwrap_or("").to_owned());
                    caps.push(cs);
                }
            }
            1 | 2 if reply == "1 \n" => {
                // Go-ahead: send all of it, or cut the stream short.
                let len = data_len.unwrap_or(0);
                let cut = u.ratio(1u8, 4)? || len > (1 << 20);
                let send = if cut {
                    len.min(u64::from(u.arbitrary::<u16>()?))
                } else {
                    len
                };
                let mut body = vec![0x5a; usize::try_from(len.min(1 << 20)).unwrap()];
                if let Some(n) = &ncs {
                    body = frame(n, &body);
                    if u.ratio(1u8, 8)? {
                        if let Some(b) = body.last_mut() {
                            *b ^= 1; // a wrong digest (or wrong data)
                        }
                    }
                }
                if cut {
                    body.truncate(usize::try_from(send).unwrap());
                }
                if !c.send(&body) {
                    c = Client::connect(&h.addr);
                    continue;
                }
                if cut {
                    let _ = c.rd.get_ref().shutdown(Shutdown::Write);
                    // The depot must roll back and close, not wait forever.
                    while c.line().is_some() {}
                    c = Client::connect(&h.addr);
                    continue;
                }
                match c.line() {
                    Some(l) if l == format!("1 {len} \n") => {}
                    Some(l) if l.starts_with('-') => {}
                    Some(l) => panic!("STORE/WRITE reply {l:?} for {len} bytes"),
                    None => c = Client::connect(&h.addr),
                }
            }
            3 if reply.starts_with("1 ") => {
                let n: u64 = reply
                    .split_whitespace()
                    .nth(1)
                    .and_then(|x| x.parse().ok())
                    .unwrap_or(0);
                assert!(
                    n <= RESOURCE,
                    "LOAD promised {n} bytes from a {RESOURCE}-byte resource"
                );
                if !c.skip(ncs.map_or(n, |x| x.framed_len(n))) {
                    c = Client::connect(&h.addr);
                }
            }
            13 if line.contains(" 31 ") && line.ends_with(&format!(" 0 {t}")) => {
                // GET_CHKSUM's digests follow: as many bytes as it says.
                let f: Vec<u64> = reply
                    .split_whitespace()
                    .filter_map(|x| x.parse().ok())
                    .collect();
                if f.len() == 6 && f[0] == 1 {
                    assert!(f[5] == f[2] * f[4], "GET_CHKSUM {reply:?}");
                    if !c.skip(f[5]) {
                        c = Client::connect(&h.addr);
                    }
                }
            }
            6 | 7 if reply.starts_with("1 ") || reply == "1\n" => {
                // Bodies: drop this connection rather than parse them.
                c = Client::connect(&h.addr);
            }
            _ => {}
        }
    }
    Ok(())
}

/// STORE `len` bytes through `caps`, and once half are sent, DECR both of
/// its counts on a second connection (read first or write first); then the
/// rest. Whatever the STORE's reply, the deletion must leave no file behind
/// (checked once the input is done).
fn delete_during_store(h: &Harness, c: &mut Client, caps: &Caps, len: u32, read_first: bool) {
    let Caps([_, w, m]) = caps;
    if !c.send(format!("1 2 {w} {len} 10\n").as_bytes()) {
        *c = Client::connect(&h.addr);
        return;
    }
    if c.line().as_deref() != Some("1 \n") {
        *c = Client::connect(&h.addr);
        return;
    }
    let body = vec![0xa5u8; len as usize];
    let half = body.len() / 2;
    let _ = c.send(&body[..half]);
    let mut other = Client::connect(&h.addr);
    let order = if read_first { [1, 2] } else { [2, 1] };
    for ct in order {
        if !other.send(format!("1 9 {m} 42 {ct} 10\n").as_bytes()) || other.line().is_none() {
            break;
        }
    }
    let _ = c.send(&body[half..]);
    match c.line() {
        Some(l) if l == format!("1 {len} \n") || l.starts_with('-') => {}
        Some(l) => panic!("STORE reply {l:?} for {len} bytes"),
        None => {}
    }
    *c = Client::connect(&h.addr);
}

fn check(h: &Harness) {
    // Wait for the depot to finish with our connections.
    for _ in 0..1000 {
        if h.depot.open_connections() == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    if let Err(e) = h.depot.store().check_accounting() {
        panic!("accounting: {e}");
    }
    let st = &h.depot.store().status()[0];
    assert!(
        st.usage.used() <= st.total && st.usage.hard <= st.hard_total,
        "usage {:?} beyond the resource ({} bytes)",
        st.usage,
        st.total
    );
    // The depot still answers.
    let mut c = Client::connect(&h.addr);
    assert!(c.send(b"1 4 3 10\n"));
    assert_eq!(c.line().as_deref(), Some("1 1 \n"));
    drop(c);
    // Delete everything (as if every lease ran out): back to zero.
    h.depot.store().reap_expired(u64::MAX);
    let st = &h.depot.store().status()[0];
    assert_eq!(
        (st.usage.hard, st.usage.soft, st.usage.count),
        (0, 0, 0),
        "usage after deleting all"
    );
    // No alias outlives the allocations, and no key is left over.
    if let Err(e) = h.depot.store().check_accounting() {
        panic!("after deleting all: {e}");
    }
    let left: Vec<_> = std::fs::read_dir(&h.data)
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
        .map(|f| f.path())
        .collect();
    assert!(
        left.is_empty(),
        "data files left after deleting all: {left:?}"
    );
}

fuzz_target!(|data: &[u8]| {
    let h = harness();
    let mut u = Unstructured::new(data);
    // Running out of input ends the sequence early; the checks run anyway.
    run(&mut u, h);
    check(h);
});
