//! A depot whose disk fills: it refuses what it cannot hold before writing
//! anything, keeps answering for what it holds, and comes back by itself
//! when space returns — no restart.

use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lors_ibp::caps::{CapKind, CapSet};
use lors_ibp::proto::{AllocType, Lease, Reliability, StatusCode};

use crate::util::{DepotProc, pattern, tempdir};

/// A tmpfs of `size` mounted at `at` in a mount namespace of its own, held
/// by a sleeping process: depots enter it with `nsenter`, the test reaches
/// its files through `/proc/PID/root`. `None` where mounting is impossible.
struct SmallDisk {
    holder: Child,
    at: PathBuf,
}

impl SmallDisk {
    fn mount(at: &Path, size: &str) -> Option<SmallDisk> {
        std::fs::create_dir_all(at).unwrap();
        let script = format!(
            "mount -t tmpfs -o size={size} tmpfs {} || exit 77; echo mounted; exec sleep 900",
            at.display()
        );
        let mut holder = Command::new("unshare")
            .args(["-m", "sh", "-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .ok()?;
        let mut line = String::new();
        let _ = BufReader::new(holder.stdout.take().unwrap()).read_line(&mut line);
        if line.trim() != "mounted" {
            let _ = holder.kill();
            let out = holder.wait_with_output().unwrap();
            eprintln!(
                "skipping: no private tmpfs here ({})",
                String::from_utf8_lossy(&out.stderr)
            );
            return None;
        }
        Some(SmallDisk {
            holder,
            at: at.to_owned(),
        })
    }

    /// The command prefix that runs a program inside the namespace.
    fn wrap(&self) -> Vec<String> {
        let pid = self.holder.id().to_string();
        vec!["nsenter".into(), "-t".into(), pid, "-m".into()]
    }

    /// `name` on the small disk, as the test sees it.
    fn path(&self, name: &str) -> PathBuf {
        let inside = self.at.join(name);
        Path::new(&format!("/proc/{}/root", self.holder.id()))
            .join(inside.strip_prefix("/").unwrap())
    }

    /// Writes `name` until the file system refuses: it is full.
    fn fill(&self, name: &str) {
        let mut f = std::fs::File::create(self.path(name)).unwrap();
        let block = vec![7u8; 64 << 10];
        while f.write_all(&block).is_ok() {}
        let small = [7u8; 512];
        while f.write_all(&small).is_ok() {}
        let _ = f.sync_all();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// A depot with resource 1 on the small disk (configured far larger than
/// it) and resource 2 on the test's own disk.
fn depot(disk: &SmallDisk, dir: &Path) -> DepotProc {
    let cfg = dir.join("depot.toml");
    let toml = format!(
        "listen = \"127.0.0.1:0\"\nsync = \"always\"\n\
         [[resource]]\nrid = \"1\"\npath = \"{}\"\nsize = \"1GiB\"\n\
         [[resource]]\nrid = \"2\"\npath = \"{}\"\nsize = \"64MiB\"\n",
        disk.at.join("r1").display(),
        dir.join("r2").display()
    );
    std::fs::write(&cfg, toml).unwrap();
    DepotProc::start_in(&disk.wrap(), dir, &["--config", cfg.to_str().unwrap()])
}

async fn allocate(
    c: &mut lors_ibp::Connection,
    rid: &str,
    secs: u64,
    size: u64,
) -> Result<CapSet, lors_ibp::Error> {
    c.allocate(
        rid,
        Reliability::Hard,
        AllocType::ByteArray,
        Lease::Secs(secs),
        size,
    )
    .await
}

/// Fills a resource through IBP until it refuses, then fills its disk from
/// outside until metadata writes fail. Every refusal is the no-space
/// status before anything is written; RID 0 goes elsewhere; a DECR that
/// fails leaves the allocation whole, also across a restart; expired
/// space comes back; freeing space brings ALLOCATE and MANAGE back within
/// a second, without a restart.
#[test]
fn a_full_disk_is_refused_survived_and_recovered_without_a_restart() {
    let dir = tempdir();
    let Some(disk) = SmallDisk::mount(&dir.path().join("small"), "16m") else {
        return;
    };
    let mut d = depot(&disk, dir.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (short, block, answers) = rt.block_on(async {
        let mut c = d.connect().await;
        let st = c.status("1", "ibp").await.unwrap();
        assert!(
            st.free_total < 16 << 20,
            "STATUS says what the file system holds, not the 1 GiB configured: {st:?}"
        );
        // Larger than the disk: refused before anything is written.
        let e = allocate(&mut c, "1", 60, 20 << 20).await.unwrap_err();
        assert_eq!(e.status(), Some(StatusCode::WOULD_EXCEED_LIMIT), "{e}");

        // Fill it through IBP: every STORE that was promised room gets it.
        let block = pattern(1 << 20, 3);
        let mut held: Vec<CapSet> = Vec::new();
        let mut short: Vec<CapSet> = Vec::new();
        loop {
            // Every other allocation expires soon: space to come back.
            let secs = if (held.len() + short.len()).is_multiple_of(2) {
                3600
            } else {
                4
            };
            match allocate(&mut c, "1", secs, 1 << 20).await {
                Ok(caps) => {
                    c.store(&caps.write, &block)
                        .await
                        .expect("a promised STORE fits");
                    if secs == 4 {
                        short.push(caps)
                    } else {
                        held.push(caps)
                    }
                }
                Err(e) => {
                    assert_eq!(e.status(), Some(StatusCode::WOULD_EXCEED_LIMIT), "{e}");
                    break;
                }
            }
            assert!(
                held.len() + short.len() < 64,
                "the 16 MiB disk never refused"
            );
        }
        eprintln!(
            "{} allocations of 1 MiB on the 16 MiB disk; free at start {}",
            held.len() + short.len(),
            st.free_total
        );
        assert!(held.len() + short.len() >= 8, "{} allocations", held.len());
        // RID 0 goes where there is room.
        let elsewhere = allocate(&mut c, "0", 60, 1 << 20).await.unwrap();
        assert_eq!(elsewhere.read.rid.as_deref(), Some("2"));

        // Now the disk fills from outside, to the last block, twice: the
        // first metadata write may spend the reserve, the next has none.
        disk.fill("fill1");
        let x = held[0].clone();
        let first = c.change(&x.manage, 0, Some(3600), None).await;
        let e = allocate(&mut c, "1", 60, 4096).await.unwrap_err();
        assert_eq!(e.status(), Some(StatusCode::WOULD_EXCEED_LIMIT), "{e}");
        let again = allocate(&mut c, "0", 60, 4096).await.unwrap();
        assert_eq!(
            again.read.rid.as_deref(),
            Some("2"),
            "placement skips the full disk"
        );
        // Aliases are metadata alone: they grow the database until a write
        // meets the full disk.
        let mut aliases = 0;
        let flood = 'flood: loop {
            for caps in &held {
                match c.alias_allocate(&caps.manage, 0, 0, Lease::Secs(60)).await {
                    Ok(_) => aliases += 1,
                    Err(e) => break 'flood e,
                }
                assert!(aliases < 20_000, "20,000 aliases on a full disk");
            }
        };
        eprintln!("{aliases} aliases, then: {flood}");
        assert_eq!(
            flood.status(),
            Some(StatusCode::WOULD_EXCEED_LIMIT),
            "{flood}"
        );
        // What the reserve gave back is taken too.
        disk.fill("fill2");
        // Each DECR's reply is what is durable: ok and gone, or refused
        // and whole.
        let mut answers = Vec::new();
        for caps in &held[1..] {
            let r = c.decr(&caps.manage, CapKind::Read).await;
            let probe = c.probe(&caps.manage).await;
            match &r {
                Ok(()) => {
                    let e = probe.expect_err("a DECR answered ok deleted it");
                    assert_eq!(e.status(), Some(StatusCode::CAP_NOT_FOUND), "{e}");
                }
                Err(e) => {
                    assert!(
                        probe.is_ok(),
                        "DECR failed ({e}) yet the allocation is gone"
                    );
                    let mut got = vec![0u8; block.len()];
                    c.load(&caps.read, 0, &mut got).await.unwrap();
                    assert!(got == block, "a failed DECR left the bytes whole");
                }
            }
            answers.push((caps.clone(), r.is_ok()));
        }
        let failed = answers.iter().filter(|(_, ok)| !ok).count();
        eprintln!(
            "on the full disk: CHNG {first:?}; {failed} of {} DECRs refused",
            answers.len()
        );
        (short, block, answers)
    });

    // A crash, and a start on the still nearly full disk: what a failed
    // DECR left is there, bytes and all.
    d.kill9();
    std::fs::remove_file(disk.path("fill2")).unwrap();
    let d = depot(&disk, dir.path());
    rt.block_on(async {
        let mut c = d.connect().await;
        for (caps, deleted) in &answers {
            let mut got = vec![0u8; block.len()];
            match c.load(&caps.read, 0, &mut got).await {
                Ok(()) => assert!(!deleted && got == block, "after the restart too"),
                Err(e) => assert!(deleted, "{e}"),
            }
        }
        // The space returns: ALLOCATE and MANAGE work again within a
        // second, no restart.
        std::fs::remove_file(disk.path("fill1")).unwrap();
        let t = Instant::now();
        loop {
            match allocate(&mut c, "1", 60, 1 << 20).await {
                Ok(caps) => {
                    assert_eq!(caps.read.rid.as_deref(), Some("1"));
                    break;
                }
                Err(e) => {
                    assert_eq!(e.status(), Some(StatusCode::WOULD_EXCEED_LIMIT), "{e}");
                    assert!(
                        t.elapsed() < Duration::from_secs(1),
                        "not back within a second"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        eprintln!("ALLOCATE back {:?} after the space returned", t.elapsed());
        for (caps, _) in answers.iter().filter(|(_, deleted)| !deleted) {
            c.decr(&caps.manage, CapKind::Read).await.unwrap();
            let e = c.probe(&caps.manage).await.unwrap_err();
            assert_eq!(e.status(), Some(StatusCode::CAP_NOT_FOUND), "{e}");
        }
        // The short leases ran out: the reaper deleted them and their
        // data files, whatever the disk went through.
        let t = Instant::now();
        for caps in &short {
            while c.probe(&caps.manage).await.is_ok() {
                assert!(
                    t.elapsed() < Duration::from_secs(15),
                    "an expired allocation stays"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        // The reaper runs each second: the space comes back.
        loop {
            let st = c.status("1", "ibp").await.unwrap();
            if st.free_total >= 8 << 20 {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(15),
                "the space never came back: {st:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

/// A second upload to a depot whose only disk is full says so and leaves
/// nothing behind (a user saw "Connection reset by peer … during STORE"),
/// and `lors depot --status` reports the room the disk really has (it
/// said 964 MiB free with 3.5 MiB left).
#[test]
fn an_upload_to_a_full_depot_says_so_and_status_tells_the_real_room() {
    let dir = tempdir();
    let Some(disk) = SmallDisk::mount(&dir.path().join("small"), "16m") else {
        return;
    };
    let cfg = dir.path().join("depot.toml");
    let toml = format!(
        "listen = \"127.0.0.1:0\"\nsync = \"always\"\n[[resource]]\nrid = \"1\"\npath = \"{}\"\nsize = \"1GiB\"\n",
        disk.at.join("r1").display()
    );
    std::fs::write(&cfg, toml).unwrap();
    let d = DepotProc::start_in(
        &disk.wrap(),
        dir.path(),
        &["--config", cfg.to_str().unwrap()],
    );
    let up = |name: &str| {
        let src = dir.path().join(name);
        std::fs::write(&src, pattern(10 << 20, 1)).unwrap();
        let xnd = dir.path().join(format!("{name}.xnd"));
        let r = crate::util::lors(&[
            "upload",
            "-q",
            "-c",
            "1",
            "-b",
            "1M",
            "--depot",
            &d.addr,
            "-o",
            xnd.to_str().unwrap(),
            src.to_str().unwrap(),
        ]);
        (r, xnd)
    };
    let ((ok, _, err), _) = up("first");
    assert!(ok, "{err}");
    let ((ok, _, err), second) = up("second");
    assert!(!ok, "a 10 MiB upload fitted a 16 MiB disk twice");
    assert!(!err.contains("reset by peer"), "{err}");
    eprintln!("{err}");
    assert!(
        err.contains("IBP_E_WOULD_EXCEED_LIMIT") || err.contains("full"),
        "{err}"
    );
    assert!(!second.exists(), "no exNode of a failed upload");
    let (ok, out, err) = crate::util::lors(&["depot", "--status", &d.addr]);
    let out = String::from_utf8_lossy(&out);
    assert!(ok, "{err}");
    // RID SIZE USED USED% HARD-USED FREE MAX-LEASE, sizes as "1.0 GiB".
    let row: Vec<&str> = (out.lines())
        .find(|l| l.starts_with("1 "))
        .unwrap_or_else(|| panic!("{out}"))
        .split_whitespace()
        .collect();
    let (free, unit) = (row[8].parse::<f64>().unwrap(), row[9]);
    assert!(
        matches!(unit, "B" | "KiB") || (unit == "MiB" && free < 6.0),
        "FREE is what the 16 MiB disk holds, less the first upload: {out}"
    );
}
