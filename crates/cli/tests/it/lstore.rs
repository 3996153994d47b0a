//! LStore's IBP extensions on our depot, driven from a plain socket with
//! the lines LStore's client (`src/ibp/op_cmd.c`) and the ACCRE depot's
//! parser agree on: alias ("proxy") allocations and disk checksums.

use lors_ibp::caps::Capability;
use lors_ibp::proto::StatusCode;

use crate::util::{DepotProc, Raw, tempdir};

fn tok(c: &Capability) -> String {
    format!("{} {}", c.key_token(), c.typekey)
}

fn err(code: StatusCode) -> String {
    format!("{} \n", code.code())
}

/// `1 <rcap> <wcap> <mcap>` → the three capabilities.
fn caps_of(line: &str) -> [Capability; 3] {
    assert!(line.starts_with("1 ibp://"), "{line:?}");
    let v: Vec<Capability> = line
        .split_whitespace()
        .skip(1)
        .map(|c| c.parse().unwrap())
        .collect();
    [v[0].clone(), v[1].clone(), v[2].clone()]
}

async fn request_caps(r: &mut Raw, line: String) -> [Capability; 3] {
    r.send(line.as_bytes()).await;
    caps_of(&r.line().await)
}

/// LOAD of `len` bytes at `off` with the key token `rd`: the data, or the
/// reply line.
pub(crate) async fn load(r: &mut Raw, rd: &str, off: u64, len: usize) -> Result<Vec<u8>, String> {
    r.send(format!("1 8 {rd} {off} {len} 10\n").as_bytes())
        .await;
    let l = r.line().await;
    if l == format!("1 {len} \n") {
        Ok(r.bytes(len).await)
    } else {
        Err(l)
    }
}

async fn write(r: &mut Raw, wr: &str, off: u64, data: &[u8]) -> String {
    r.send(format!("1 13 {wr} {off} {} 10\n", data.len()).as_bytes())
        .await;
    let go = r.line().await;
    if go != "1 \n" {
        return go;
    }
    r.send(data).await;
    r.line().await
}

/// The fields of a PROBE reply after the status.
async fn probe(r: &mut Raw, line: String) -> Vec<u64> {
    r.send(line.as_bytes()).await;
    let l = r.line().await;
    assert!(l.starts_with("1 "), "{line:?} → {l:?}");
    l.split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap())
        .collect()
}

/// `ibp_perf`'s proxy mode and the rest of ALIAS_ALLOCATE/ALIAS_MANAGE: an
/// alias's keys reach only its window; its manage key probes, counts and
/// moves it only with the master's manage key; it costs no space, survives
/// a restart, and goes with its allocation.
#[tokio::test]
async fn alias_keys_reach_only_their_window_and_go_with_their_allocation() {
    let dir = tempdir();
    let mut d = DepotProc::start(dir.path(), &[]);
    let mut r = Raw::connect(&d.addr).await;
    let [rd, wr, mg] = request_caps(&mut r, "1 1 0 2 1 3600 1024 10\n".into()).await;
    let (rd, wr, mg) = (tok(&rd), tok(&wr), tok(&mg));
    r.send(format!("1 2 {wr} 10 10\n").as_bytes()).await;
    assert_eq!(r.line().await, "1 \n");
    r.send(b"0123456789").await;
    assert_eq!(r.line().await, "1 10 \n");
    let used = |p: &[u64]| p[2];
    let status = format!("1 9 {mg} 40 0 0 0 0 10\n");
    let before = probe(&mut r, status.clone()).await;

    // A window of 5 bytes at 2, for as long as the allocation lives.
    let [ard, awr, amg] = request_caps(&mut r, format!("1 14 {mg} 2 5 0 10\n")).await;
    let (ard, awr, amg) = (tok(&ard), tok(&awr), tok(&amg));
    assert_eq!(load(&mut r, &ard, 0, 5).await.unwrap(), b"23456");
    assert_eq!(
        load(&mut r, &ard, 1, 5).await,
        Err(err(StatusCode::WOULD_EXCEED_LIMIT))
    );
    assert_eq!(write(&mut r, &awr, 1, b"XY").await, "1 2 \n");
    assert_eq!(load(&mut r, &rd, 0, 10).await.unwrap(), b"012XY56789");
    // A WRITE past the window is refused before the go-ahead, and closes.
    assert_eq!(
        write(&mut r, &awr, 4, b"XY").await,
        err(StatusCode::WOULD_EXCEED_LIMIT)
    );
    assert!(r.closed().await);
    let mut r = Raw::connect(&d.addr).await;
    // So is a STORE through a window that does not start at 0.
    r.send(format!("1 2 {awr} 1 10\n").as_bytes()).await;
    assert_eq!(r.line().await, err(StatusCode::WOULD_EXCEED_LIMIT));
    assert!(r.closed().await);
    let mut r = Raw::connect(&d.addr).await;

    // MANAGE PROBE through the alias sees the window; nothing else passes.
    let p = probe(&mut r, format!("1 9 {amg} 40 0 0 0 0 10\n")).await;
    assert_eq!((p[0], p[1], p[2], p[3]), (1, 0, 5, 5), "{p:?}");
    r.send(format!("1 9 {amg} 42 1 10\n").as_bytes()).await;
    assert_eq!(r.line().await, err(StatusCode::INVALID_CMD));
    // ALIAS_MANAGE PROBE as LStore sends it: counts, window, lease.
    let p = probe(&mut r, format!("1 15 {amg} 40 3 10\n")).await;
    assert_eq!(&p[..4], &[1, 0, 2, 5]);
    assert!((3590..=3600).contains(&p[4]), "{p:?}");
    // The space is the allocation's alone.
    assert_eq!(used(&probe(&mut r, status.clone()).await), used(&before));

    // CHNG in LStore's form (no cap type) needs the master's manage key.
    r.send(format!("1 15 {amg} 43 0 10 0 {ard} 10\n").as_bytes())
        .await;
    assert_eq!(r.line().await, err(StatusCode::INVALID_MANAGE_CAP));
    r.send(format!("1 15 {amg} 43 0 10 0 {mg} 10\n").as_bytes())
        .await;
    assert_eq!(r.line().await, "1 \n");
    assert_eq!(load(&mut r, &ard, 0, 10).await.unwrap(), b"012XY56789");
    // The ACCRE depot's form, with a cap type; a window past the end and a
    // lease past the allocation's are refused.
    r.send(format!("1 15 {amg} 43 3 0 1025 -1 {mg} 10\n").as_bytes())
        .await;
    assert_eq!(r.line().await, err(StatusCode::WOULD_EXCEED_POLICY));
    r.send(format!("1 15 {amg} 43 3 0 4 7200 {mg} 10\n").as_bytes())
        .await;
    assert_eq!(r.line().await, err(StatusCode::WOULD_EXCEED_POLICY));
    r.send(format!("1 15 {amg} 43 3 0 4 60 {mg} 10\n").as_bytes())
        .await;
    assert_eq!(r.line().await, "1 \n");
    let p = probe(&mut r, format!("1 15 {amg} 40 3 10\n")).await;
    assert_eq!(&p[2..4], &[0, 4]);
    assert!((50..=60).contains(&p[4]), "{p:?}");

    // ALIAS_ALLOCATE refusals: past the end, longer than the allocation.
    r.send(format!("1 14 {mg} 1000 25 0 10\n").as_bytes()).await;
    assert_eq!(r.line().await, err(StatusCode::WOULD_EXCEED_LIMIT));
    r.send(format!("1 14 {mg} 0 0 7200 10\n").as_bytes()).await;
    assert_eq!(r.line().await, err(StatusCode::LONG_DURATION));
    r.send(format!("1 14 {amg} 0 0 0 10\n").as_bytes()).await;
    assert_eq!(r.line().await, err(StatusCode::INVALID_CMD));

    // A whole alias appends; it and the first survive a restart.
    let [wrd, wwr, wmg] = request_caps(&mut r, format!("1 14 {mg} 0 0 0 10\n")).await;
    let (wrd, wwr, wmg) = (tok(&wrd), tok(&wwr), tok(&wmg));
    r.send(format!("1 2 {wwr} 3 10\n").as_bytes()).await;
    assert_eq!(r.line().await, "1 \n");
    r.send(b"abc").await;
    assert_eq!(r.line().await, "1 3 \n");
    drop(r);
    d.terminate();
    let d = DepotProc::start(dir.path(), &[]);
    let mut r = Raw::connect(&d.addr).await;
    assert_eq!(load(&mut r, &wrd, 0, 13).await.unwrap(), b"012XY56789abc");
    assert_eq!(load(&mut r, &ard, 0, 4).await.unwrap(), b"012X");

    // DECR of the alias's read count with the master key deletes the alias
    // (ibp_perf's proxy remove); the allocation stays.
    r.send(format!("1 15 {amg} 42 1 {mg} 10\n").as_bytes())
        .await;
    assert_eq!(r.line().await, "1 \n");
    assert_eq!(
        load(&mut r, &ard, 0, 1).await,
        Err(err(StatusCode::CAP_NOT_FOUND))
    );
    assert_eq!(load(&mut r, &rd, 0, 1).await.unwrap(), b"0");
    // Deleting the allocation takes its remaining alias with it, for good.
    r.send(format!("1 9 {mg} 42 1 10\n").as_bytes()).await;
    assert_eq!(r.line().await, "1 \n");
    assert_eq!(
        load(&mut r, &wrd, 0, 1).await,
        Err(err(StatusCode::CAP_NOT_FOUND))
    );
    r.send(format!("1 15 {wmg} 40 3 10\n").as_bytes()).await;
    assert_eq!(r.line().await, err(StatusCode::CAP_NOT_FOUND));
}

/// The data file of the allocation a capability names (files are named by
/// the allocation id, the capability's typekey, in hex).
fn data_file(dir: &std::path::Path, c: &Capability) -> std::path::PathBuf {
    let id: u64 = c.typekey.parse().unwrap();
    dir.join("data")
        .join(format!("{:02x}", id & 0xff))
        .join(format!("{id:016x}"))
}

fn md5(b: &[u8]) -> Vec<u8> {
    let mut h = lors_ibp::proto::chksum::BlockHasher::new(lors_ibp::proto::chksum::ChksumType::Md5);
    h.update(b);
    h.finish_bytes()
}

/// `ibp_perf -disk_chksum`: ALLOCATE_CHKSUM, WRITEs in reverse block order
/// (holes first), LOADs checked against the stored digests, GET_CHKSUM's
/// digests, and what damage on disk does: LOAD of the damaged block -63,
/// the rest served, VALIDATE_CHKSUM counts it and, asked to, re-digests it.
#[tokio::test]
async fn disk_checksummed_allocations_keep_digests_and_refuse_damaged_blocks() {
    let dir = tempdir();
    let mut d = DepotProc::start(dir.path(), &[]);
    let mut r = Raw::connect(&d.addr).await;
    // MD5 digests of 4-byte blocks.
    let [rd, wr, mg] = request_caps(&mut r, "1 29 4 4 0 2 1 3600 64 10\n".into()).await;
    let (rdc, (rd, wr, mg)) = (rd.clone(), (tok(&rd), tok(&wr), tok(&mg)));
    // ibp_perf writes the last block first: bytes 8..10, then 4..8, 0..4.
    assert_eq!(write(&mut r, &wr, 8, b"ij").await, "1 2 \n");
    assert_eq!(
        load(&mut r, &rd, 0, 10).await.unwrap(),
        b"\0\0\0\0\0\0\0\0ij"
    );
    assert_eq!(write(&mut r, &wr, 4, b"efgh").await, "1 4 \n");
    assert_eq!(write(&mut r, &wr, 0, b"abcd").await, "1 4 \n");
    r.send(format!("1 2 {wr} 3 10\n").as_bytes()).await;
    assert_eq!(r.line().await, "1 \n");
    r.send(b"klm").await;
    assert_eq!(r.line().await, "1 3 \n");
    assert_eq!(load(&mut r, &rd, 0, 13).await.unwrap(), b"abcdefghijklm");

    // GET_CHKSUM: the summary as the ACCRE depot words it, then the binary
    // digests of "abcd", "efgh", "ijkl", "m".
    r.send(format!("1 31 {mg} 1 10\n").as_bytes()).await;
    assert_eq!(r.line().await, "1 4 16 4 4 64\n");
    r.send(format!("1 31 {mg} 0 10\n").as_bytes()).await;
    assert_eq!(r.line().await, "1 4 16 4 4 64\n");
    let want = [md5(b"abcd"), md5(b"efgh"), md5(b"ijkl"), md5(b"m")].concat();
    assert_eq!(r.bytes(64).await, want);
    r.send(format!("1 32 {mg} 0 10\n").as_bytes()).await;
    assert_eq!(r.line().await, "1 0\n");

    // Damage byte 5 on disk behind the depot's back.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(data_file(dir.path(), &rdc))
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"X", 4096 + 5).unwrap();
    drop(f);
    assert_eq!(load(&mut r, &rd, 0, 13).await, Err(err(StatusCode::CHKSUM)));
    assert_eq!(load(&mut r, &rd, 5, 1).await, Err(err(StatusCode::CHKSUM)));
    assert_eq!(load(&mut r, &rd, 0, 4).await.unwrap(), b"abcd");
    assert_eq!(load(&mut r, &rd, 8, 5).await.unwrap(), b"ijklm");
    r.send(format!("1 32 {mg} 0 10\n").as_bytes()).await;
    assert_eq!(r.line().await, "1 1\n");
    // Digests survive a restart (and the damage is still found).
    drop(r);
    d.terminate();
    let d = DepotProc::start(dir.path(), &[]);
    let mut r = Raw::connect(&d.addr).await;
    assert_eq!(load(&mut r, &rd, 4, 4).await, Err(err(StatusCode::CHKSUM)));
    // VALIDATE with correct_errors takes the bytes as they are now.
    r.send(format!("1 32 {mg} 1 10\n").as_bytes()).await;
    assert_eq!(r.line().await, "1 1\n");
    r.send(format!("1 32 {mg} 0 10\n").as_bytes()).await;
    assert_eq!(r.line().await, "1 0\n");
    assert_eq!(load(&mut r, &rd, 4, 4).await.unwrap(), b"eXgh");
    // A rewrite of the damaged block re-digests it; TRUNCATE re-digests the
    // new last block.
    assert_eq!(write(&mut r, &wr, 4, b"EFGH").await, "1 4 \n");
    r.send(format!("1 9 {mg} 45 6 10\n").as_bytes()).await;
    assert_eq!(r.line().await, "1 \n");
    assert_eq!(load(&mut r, &rd, 0, 6).await.unwrap(), b"abcdEF");
    r.send(format!("1 31 {mg} 0 10\n").as_bytes()).await;
    assert_eq!(r.line().await, "1 4 16 4 2 32\n");
    assert_eq!(r.bytes(32).await, [md5(b"abcd"), md5(b"EF")].concat());

    // Refusals, as the ACCRE depot answers them.
    for (line, code) in [
        ("1 29 9 4 0 2 1 3600 64 10\n", StatusCode::CHKSUM_TYPE),
        ("1 29 4 0 0 2 1 3600 64 10\n", StatusCode::CHKSUM_BLOCKSIZE),
        (
            "1 29 4 16777217 0 2 1 3600 64 10\n",
            StatusCode::CHKSUM_BLOCKSIZE,
        ),
        (
            "1 29 4 64 0 2 3 3600 64 10\n",
            StatusCode::TYPE_NOT_SUPPORTED,
        ),
    ] {
        r.send(line.as_bytes()).await;
        assert_eq!(r.line().await, err(code), "{line}");
    }
    // Type 0 is a plain allocation: no digests to get, none to fail.
    let [_, _, pmg] = request_caps(&mut r, "1 29 0 0 0 2 1 3600 64 10\n".into()).await;
    r.send(format!("1 31 {} 1 10\n", tok(&pmg)).as_bytes())
        .await;
    assert_eq!(r.line().await, err(StatusCode::CHKSUM));
    r.send(format!("1 32 {} 0 10\n", tok(&pmg)).as_bytes())
        .await;
    assert_eq!(r.line().await, "1 0\n");
}
