//! `lors mount` with the kernel's FUSE: plain `cp`, `cat`, `dd`, `cmp`,
//! `tar`, `rsync` and `sqlite3` on files stored on real depots.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::tools::used;
use crate::util::{DepotProc, lors, pattern, tempdir};

/// A running `lors mount`; unmounted (SIGTERM) when dropped.
pub(crate) struct Mount {
    child: Child,
    at: std::path::PathBuf,
}

impl Mount {
    pub(crate) fn start(dir: &Path, at: &Path, extra: &[&str]) -> Mount {
        Mount::start_with(Command::new(env!("CARGO_BIN_EXE_lors")), dir, at, extra)
    }

    /// `cmd` (`lors`, or a wrapper that runs it) `mount EXTRA DIR AT`.
    fn start_with(mut cmd: Command, dir: &Path, at: &Path, extra: &[&str]) -> Mount {
        let mut child = cmd
            .arg("mount")
            .args(extra)
            .arg(dir)
            .arg(at)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("lors mount says it is ready");
        assert!(line.starts_with("lors mount: "), "{line}");
        Mount {
            child,
            at: at.to_path_buf(),
        }
    }

    /// SIGKILL, as the OOM killer or a crash would end it: nothing is
    /// saved or freed on the way out; the mount point is let go.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }

    /// SIGTERM: unmounts and exits 0.
    pub(crate) fn stop(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let t0 = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "lors mount did not stop"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.stop();
        }
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }
}

/// `data` as `ROOT/src`, uploaded to `d` (one copy, `upload_flags`) as
/// `ROOT/x/f.xnd`; returns the exNode directory and a mount point
/// (`ROOT/m`).
fn one_file_on(
    d: &DepotProc,
    root: &Path,
    data: Vec<u8>,
    upload_flags: &[&str],
) -> (std::path::PathBuf, std::path::PathBuf) {
    let (xnds, mnt) = (root.join("x"), root.join("m"));
    std::fs::create_dir(&xnds).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    std::fs::write(root.join("src"), data).unwrap();
    let xnd = xnds.join("f.xnd");
    let src = root.join("src");
    let mut args = vec!["upload", "--depot", &d.addr, "-c", "1"];
    args.extend_from_slice(upload_flags);
    args.extend(["-o", xnd.to_str().unwrap(), src.to_str().unwrap()]);
    let (ok, _, err) = lors(&args);
    assert!(ok, "{err}");
    (xnds, mnt)
}

/// Pipes the process `pid` has open.
fn pipes_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.unwrap().path()).ok())
        .filter(|t| t.to_string_lossy().starts_with("pipe:"))
        .count()
}

fn mounted(at: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let at = at.canonicalize().unwrap_or_else(|_| at.to_path_buf());
    mounts
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(at.to_str().unwrap()))
}

fn sh(script: &str, dir: &Path) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn mount_serves_exnodes_to_cp_cat_dd_cmp_tar_and_sqlite() {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: /dev/fuse is absent on this machine, so nothing can be mounted");
        return;
    }
    let dir = tempdir();
    let d1 = DepotProc::start(&dir.path().join("d1"), &[]);
    let d2 = DepotProc::start(&dir.path().join("d2"), &[]);
    let root = dir.path();
    let xnds = root.join("x");
    let mnt = root.join("m");
    std::fs::create_dir(&xnds).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let data = pattern(5 * (1 << 20) + 4321, 5);
    std::fs::write(root.join("src"), &data).unwrap();
    let (ok, _, err) = lors(&[
        "upload",
        "--depot",
        &d1.addr,
        "--depot",
        &d2.addr,
        "-c",
        "2",
        "-b",
        "1M",
        "-o",
        xnds.join("up.xnd").to_str().unwrap(),
        root.join("src").to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let mut m = Mount::start(
        &xnds,
        &mnt,
        &[
            "--depot", &d1.addr, "--depot", &d2.addr, "-c", "2", "-B", "1M",
        ],
    );
    assert!(mounted(&mnt));

    // Reading an uploaded file: ls, stat, cat, dd with 4 KiB reads, cmp.
    assert_eq!(sh("ls m", root), "up\n");
    assert_eq!(sh("stat -c %s m/up", root).trim(), data.len().to_string());
    assert_eq!(std::fs::read(mnt.join("up")).unwrap(), data);
    sh("cat m/up > cat.out && cmp src cat.out", root);
    sh(
        "dd if=m/up of=dd.out bs=4k 2>/dev/null && cmp src dd.out",
        root,
    );
    sh("cmp src m/up", root);
    // Those reads were answered by splicing the read-ahead's pipes into
    // /dev/fuse: the mount holds pipes (unless, unprivileged, it copies).
    assert!(
        pipes_of(m.child.id()) > 0 || !lors_ibp::spliced::unlimited(),
        "no pipe in the mount: reads were not spliced"
    );
    // With --copy-reads they are answered from memory: the same bytes.
    {
        std::fs::create_dir(root.join("m2")).unwrap();
        let mut copying = Mount::start(
            &xnds,
            &root.join("m2"),
            &["--depot", &d1.addr, "--copy-reads"],
        );
        sh(
            "cmp src m2/up && dd if=m2/up bs=4k 2>/dev/null | cmp src -",
            root,
        );
        assert!(copying.stop().success());
    }

    // Writing: cp, and dd with 4 KiB writes, each read back and stored as
    // whole 1 MiB blocks (2 copies), not a mapping per write.
    sh("cp src m/copy && cmp src m/copy", root);
    sh(
        "dd if=src of=m/small bs=4k 2>/dev/null && cmp src m/small",
        root,
    );
    for name in ["copy", "small"] {
        let x = lors::xnd::load(&xnds.join(format!("{name}.xnd"))).unwrap();
        assert_eq!(x.logical_size(), data.len() as u64);
        assert_eq!(x.mappings.len(), 6 * 2, "{name}: 6 blocks × 2 copies");
        let (ok, out, err) = lors(&[
            "download",
            xnds.join(format!("{name}.xnd")).to_str().unwrap(),
            "-o",
            "-",
        ]);
        assert!(ok, "{err}");
        assert_eq!(out, data, "{name}: the tools read what the mount wrote");
    }

    // Appends, truncation, renames and removal.
    sh(
        "printf tail >> m/copy && tail -c 4 m/copy | grep -qx tail",
        root,
    );
    sh(
        "truncate -s 1000 m/copy && test $(stat -c %s m/copy) = 1000",
        root,
    );
    sh("head -c 1000 src | cmp - m/copy", root);
    sh(
        "mv m/copy m/moved && test ! -e m/copy && cmp m/moved x/../m/moved",
        root,
    );
    assert!(xnds.join("moved.xnd").exists() && !xnds.join("copy.xnd").exists());
    sh("rm m/moved && test ! -e m/moved", root);
    assert!(!xnds.join("moved.xnd").exists());

    // Two descriptors writing one file at once share its state: both
    // writes land, and removing the file frees every block either made.
    let before = used(&d1) + used(&d2);
    sh(
        "python3 -c \"import os; a = os.open('m/w', os.O_WRONLY | os.O_CREAT); \
         b = os.open('m/w', os.O_WRONLY); os.pwrite(a, b'A' * 3000000, 0); \
         os.pwrite(b, b'B' * 3000000, 3000000); os.close(a); os.close(b)\"",
        root,
    );
    let w = std::fs::read(mnt.join("w")).unwrap();
    assert!(
        w.len() == 6_000_000
            && w[..3_000_000].iter().all(|&c| c == b'A')
            && w[3_000_000..].iter().all(|&c| c == b'B')
    );
    sh("rm m/w", root);
    assert_eq!(
        used(&d1) + used(&d2),
        before,
        "nothing of the shared file left on the depots"
    );

    // tar through the mount.
    sh(
        "mkdir t && cp src t/a && printf b > t/b && tar cf m/t.tar t && mkdir u && tar xf m/t.tar -C u && cmp src u/t/a",
        root,
    );

    // rsync: writes a temporary name, renames it, sets modes and times.
    sh(
        "mkdir rs && cp src rs/one && printf two > rs/two && rsync -a rs/ m/ && cmp src m/one && rsync -a --checksum rs/ m/",
        root,
    );
    assert_eq!(std::fs::read(mnt.join("two")).unwrap(), b"two");

    // sqlite3, which locks, seeks and overwrites pages, where installed.
    if Command::new("sqlite3").arg("-version").output().is_ok() {
        sh(
            "sqlite3 m/db 'create table t(a); insert into t values (1),(2),(3);'",
            root,
        );
        assert_eq!(sh("sqlite3 m/db 'select sum(a) from t'", root).trim(), "6");
    } else {
        assert!(
            std::env::var_os("LORS_REQUIRE_SERVICES").is_none(),
            "sqlite3 missing: scripts/services.sh installs it"
        );
        eprintln!("sqlite3 not installed: its part of this test skipped");
    }

    // Unmounting stores everything and leaves the .xnd files readable.
    assert!(m.stop().success());
    assert!(!mounted(&mnt));
    let (ok, out, err) = lors(&[
        "download",
        xnds.join("small.xnd").to_str().unwrap(),
        "-o",
        "-",
    ]);
    assert!(ok, "{err}");
    assert_eq!(out, data);
}

#[test]
fn mount_reports_an_unreadable_block_as_eio() {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: /dev/fuse is absent on this machine, so nothing can be mounted");
        return;
    }
    let dir = tempdir();
    let mut d = DepotProc::start(&dir.path().join("d"), &[]);
    let root = dir.path();
    let (xnds, mnt) = one_file_on(&d, root, pattern(1 << 20, 1), &[]);
    let _m = Mount::start(&xnds, &mnt, &["-T", "5", "--depot", &d.addr, "-B", "1M"]);
    d.kill9();
    let out = Command::new("cat").arg(mnt.join("f")).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Input/output error"), "{err}");
    // Writing with no depot to take the data: cp fails, and what it leaves
    // names no data (never a file that looks complete).
    std::fs::write(root.join("big"), pattern(3 << 20, 2)).unwrap();
    let out = Command::new("cp")
        .arg(root.join("big"))
        .arg(mnt.join("new"))
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "cp to a mount with no depot left succeeded"
    );
    let x = lors::xnd::load(&xnds.join("new.xnd")).unwrap();
    assert!(x.mappings.is_empty(), "{:?}", x.mappings);
}

/// A file stored as it is (no end-to-end functions) is read through pipes
/// the read-ahead keeps; with descriptors short (a low open-file limit the
/// mount cannot raise), what does not fit in pipes goes through memory and
/// programs read the same bytes.
#[test]
fn mount_reads_raw_blocks_through_pipes_and_with_few_descriptors() {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: /dev/fuse is absent on this machine, so nothing can be mounted");
        return;
    }
    let dir = tempdir();
    let d = DepotProc::start(&dir.path().join("d"), &[]);
    let root = dir.path();
    let (xnds, mnt) = one_file_on(&d, root, pattern(24 << 20, 3), &["-n"]);

    let mut m = Mount::start(&xnds, &mnt, &["--depot", &d.addr]);
    sh("dd if=m/f bs=4k 2>/dev/null | cmp src -", root);
    // Pieces in the cache, each in a pipe; more than the threads' own
    // reply and scratch pipes.
    // (A mount without privilege copies, and keeps no pieces in pipes.)
    let pipes = pipes_of(m.child.id());
    assert_eq!(
        pipes > 16,
        lors_ibp::spliced::unlimited(),
        "{pipes} pipes: kept by the read-ahead only with privilege"
    );
    assert!(m.stop().success());

    let mut limited = Command::new("prlimit");
    limited.args(["--nofile=64:64", env!("CARGO_BIN_EXE_lors")]);
    let mut m = Mount::start_with(limited, &xnds, &mnt, &["--depot", &d.addr]);
    sh(
        "dd if=m/f bs=4k 2>/dev/null | cmp src - && cat m/f | cmp src -",
        root,
    );
    assert!(pipes_of(m.child.id()) < 64);
    assert!(m.stop().success());
}

/// Times and modes set through the mount are kept in the exNode: after a
/// remount they are still there, and a second `rsync -a` sends nothing;
/// so are a directory made on the mount, its mode and time.
#[test]
fn mount_keeps_times_and_modes_across_a_remount() {
    let dir = tempdir();
    let d = DepotProc::start(&dir.path().join("d"), &[]);
    let (xnds, mnt) = one_file_on(&d, dir.path(), pattern(300_000, 8), &[]);
    let mut m = Mount::start(&xnds, &mnt, &["--depot", &d.addr]);
    sh("touch -m -d '2001-02-03 04:05:06' f && chmod 0640 f", &mnt);
    let src = dir.path().join("tree");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("a.bin"), pattern(100_000, 1)).unwrap();
    std::fs::write(src.join("b.bin"), pattern(50_000, 2)).unwrap();
    sh(
        "touch -d '2010-01-01 00:00:00' tree/a.bin tree/b.bin",
        dir.path(),
    );
    sh(&format!("rsync -a tree/ {}/", mnt.display()), dir.path());
    // cp -p and tar -xpf set the times while the file is open, before its
    // blocks are stored at close; new files take the mode asked for.
    sh(
        &format!(
            "chmod 0644 tree/a.bin && cp -p tree/a.bin {m}/cp-p \
             && chmod 0664 tree/b.bin && tar -cf t.tar -C tree b.bin \
             && tar -xpf t.tar -C {m} --transform s/b.bin/tarred/ \
             && (umask 002 && echo hi > {m}/umask002) && (umask 022 && touch {m}/touched)",
            m = mnt.display()
        ),
        dir.path(),
    );
    let stat = |f: &str| sh(&format!("stat -c '%a %Y' {f}"), &mnt);
    assert_eq!(stat("f").trim(), "640 981173106");
    // A directory is a subdirectory of the exNodes; its time is kept too.
    sh(
        "mkdir -m 0750 sub && cp f sub/g && touch -d '2003-04-05 06:07:08' sub",
        &mnt,
    );
    assert!(xnds.join("sub/g.xnd").is_file());
    assert_eq!(m.stop().code(), Some(0));
    let _m = Mount::start(&xnds, &mnt, &["--depot", &d.addr]);
    assert_eq!(stat("f").trim(), "640 981173106", "after a remount");
    assert_eq!(stat("sub").trim(), "750 1049522828", "a directory");
    sh("cmp f sub/g", &mnt);
    for f in ["a.bin", "b.bin"] {
        assert!(stat(f).ends_with(" 1262304000\n"), "{f}: {}", stat(f));
    }
    assert_eq!(
        stat("cp-p").trim(),
        "644 1262304000",
        "cp -p, after a remount"
    );
    assert_eq!(
        stat("tarred").trim(),
        "664 1262304000",
        "tar -xpf, after a remount"
    );
    assert!(stat("umask002").starts_with("664 "), "{}", stat("umask002"));
    assert!(stat("touched").starts_with("644 "), "{}", stat("touched"));
    // Everything is as rsync left it: a second run sends no file.
    let again = sh(
        &format!("rsync -a --itemize-changes tree/ {}/", mnt.display()),
        dir.path(),
    );
    assert!(
        !again
            .lines()
            .any(|l| l.starts_with(">f") || l.starts_with("<f")),
        "a second rsync -a sent files: {again}"
    );
}

/// Bytes the depot has sent by LOAD.
fn loaded(d: &DepotProc) -> f64 {
    let (_, body) = crate::metrics::scrape(d.metrics.as_ref().unwrap(), "text/plain");
    crate::metrics::value(&body, "lors_depot_bytes_out_total").unwrap_or(0.0)
}

/// Debian's nginx, unmodified, serving `root` on a free port; `sendfile`
/// on or off. Killed when dropped.
struct Nginx(Child, u16);

/// This test process runs as root.
pub(crate) fn as_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
}

impl Nginx {
    /// Workers as the user who mounted (a FUSE mount without allow_other
    /// is that user's alone).
    fn start(dir: &Path, root: &Path, sendfile: bool) -> Nginx {
        let user = if as_root() { Some("root") } else { None };
        Nginx::start_as(dir, root, sendfile, user)
    }

    /// Workers as `user` (root only can switch).
    fn start_as(dir: &Path, root: &Path, sendfile: bool, user: Option<&str>) -> Nginx {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let tag = if sendfile { "on" } else { "off" };
        let conf = dir.join(format!("nginx-{tag}.conf"));
        let user = user.map_or(String::new(), |u| format!("user {u};"));
        std::fs::write(
            &conf,
            format!(
                "{user} worker_processes 1; daemon off; master_process on; pid {d}/nginx-{tag}.pid;
error_log {d}/nginx-{tag}.log;
events {{ worker_connections 64; }}
http {{ access_log off; sendfile {tag}; client_body_temp_path {d}/nginx-body-{tag};
  proxy_temp_path {d}/nginx-proxy-{tag}; fastcgi_temp_path {d}/nginx-fcgi-{tag};
  uwsgi_temp_path {d}/nginx-uwsgi-{tag}; scgi_temp_path {d}/nginx-scgi-{tag};
  server {{ listen 127.0.0.1:{port}; root {root}; }} }}
",
                d = dir.display(),
                root = root.display()
            ),
        )
        .unwrap();
        let child = Command::new("nginx")
            .args(["-c", conf.to_str().unwrap(), "-p", dir.to_str().unwrap()])
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx (Debian package nginx; scripts/services.sh installs it)");
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "nginx did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Nginx(child, port)
    }

    /// The HTTP status of a GET of `path`.
    fn status(&self, path: &str) -> String {
        let out = Command::new("curl")
            .args([
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "60",
            ])
            .arg(format!("http://127.0.0.1:{}/{path}", self.1))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `curl` of `path`, with `range` (`-r A-B`) when given.
    fn get(&self, path: &str, range: Option<&str>) -> Vec<u8> {
        let mut c = Command::new("curl");
        c.args(["-sSf", "--max-time", "60"]);
        if let Some(r) = range {
            c.args(["-r", r]);
        }
        let out = c
            .arg(format!("http://127.0.0.1:{}/{path}", self.1))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "curl: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The Data Reservoir's file-system transparency: an unmodified HTTP
/// server (with and without `sendfile`) and rsync serve what the mount
/// shows, and a range request becomes a range read on the depots.
#[test]
fn nginx_and_rsync_serve_the_mount_and_a_range_request_reads_only_its_range() {
    let dir = tempdir();
    let d = DepotProc::start(&dir.path().join("d"), &["--metrics-listen", "127.0.0.1:0"]);
    let data = pattern(48 << 20, 11);
    let (xnds, mnt) = one_file_on(&d, dir.path(), data.clone(), &["-b", "4M"]);
    let _m = Mount::start(&xnds, &mnt, &["--depot", &d.addr]);
    for sendfile in [true, false] {
        let web = Nginx::start(dir.path(), &mnt, sendfile);
        assert!(
            web.get("f", None) == data,
            "whole file, sendfile {sendfile}"
        );
        let before = loaded(&d);
        let at = 30_000_123 + usize::from(sendfile) * 5_000_000;
        let got = web.get("f", Some(&format!("{at}-{}", at + 65_535)));
        assert!(got == data[at..at + 65_536], "range, sendfile {sendfile}");
        // The mount fetched the range's stretch, not the file: a few MiB
        // at most (its 1 MiB e2e blocks), not 48.
        let read = loaded(&d) - before;
        assert!(
            read < (4 << 20) as f64,
            "a 64 KiB range read {read} bytes from the depot"
        );
    }
    let copy = dir.path().join("copy");
    sh(
        &format!(
            "rsync -a {}/ {}/ && cmp src copy/f",
            mnt.display(),
            copy.display()
        ),
        dir.path(),
    );
}

/// nginx as Debian runs it, workers as www-data, on a mount other users
/// may reach: the exNodes' owner-only mode refuses them until the mount
/// is given a mode for files that record none (`--file-mode`), or shows
/// them as www-data's (`--uid`).
#[test]
fn nginx_as_www_data_serves_the_mount_given_a_file_mode_or_owner() {
    if !as_root() {
        eprintln!("skipped: only root starts nginx workers as www-data");
        return;
    }
    let dir = tempdir();
    // www-data reaches the mount point through the test's directory.
    sh(&format!("chmod 0755 {}", dir.path().display()), dir.path());
    let d = DepotProc::start(&dir.path().join("d"), &[]);
    let data = pattern(3 << 20, 5);
    let (xnds, mnt) = one_file_on(&d, dir.path(), data.clone(), &[]);
    let mount = |extra: &[&str]| {
        let mut a = vec!["--depot", d.addr.as_str(), "--allow-other"];
        a.extend_from_slice(extra);
        Mount::start(&xnds, &mnt, &a)
    };
    let web = |tag| {
        let conf = dir.path().join(tag);
        std::fs::create_dir(&conf).unwrap();
        Nginx::start_as(&conf, &mnt, true, Some("www-data"))
    };
    {
        let _m = mount(&[]);
        let w = web("plain");
        assert_eq!(w.status("f"), "403", "an owner-only file to another user");
    }
    {
        let _m = mount(&["--file-mode", "0644"]);
        let w = web("mode");
        assert!(w.get("f", None) == data, "--file-mode 0644");
        // A mode set through the mount is the file's own: kept.
        sh("chmod 0600 f", &mnt);
        assert_eq!(w.status("f"), "403", "chmod 0600 through the mount");
    }
    let _m = mount(&["--uid", "www-data", "--gid", "www-data"]);
    let w = web("owner");
    assert_eq!(
        sh("stat -c '%U:%G %a' f", &mnt).trim(),
        "www-data:www-data 600"
    );
    assert!(w.get("f", None) == data, "--uid www-data");
}

/// `rm` on the mount does what `lors rm` does: an erasure-coded file's
/// blocks, parity too, are freed (they were left on the depots, the
/// `.xnd` gone), and a copy made with `lors cp` keeps its data.
#[test]
fn rm_on_the_mount_frees_an_erasure_coded_file_and_spares_its_copy() {
    let dir = tempdir();
    let ds: Vec<DepotProc> = (0..3)
        .map(|i| DepotProc::start(&dir.path().join(format!("d{i}")), &[]))
        .collect();
    let all: Vec<&str> = ds.iter().map(|d| d.addr.as_str()).collect();
    let data = pattern(1 << 20, 9);
    let (xnds, mnt) = (dir.path().join("x"), dir.path().join("m"));
    std::fs::create_dir(&xnds).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let (f, kept) = (xnds.join("f.xnd"), dir.path().join("kept.xnd"));
    let src = dir.path().join("src");
    std::fs::write(&src, &data).unwrap();
    let depots = all.join(",");
    let (ok, _, err) = lors(&[
        "upload",
        "--depot",
        &depots,
        "--ec",
        "2+1",
        "-b",
        "128k",
        "-o",
        f.to_str().unwrap(),
        src.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let (ok, _, err) = lors(&["cp", f.to_str().unwrap(), kept.to_str().unwrap()]);
    assert!(ok, "{err}");
    let _m = Mount::start(&xnds, &mnt, &["--depot", &depots]);
    sh("rm f", &mnt);
    assert!(!f.exists());
    crate::copies::check(&ds, dir.path(), &[(&kept, &data)], "rm on the mount");
    let (ok, _, err) = lors(&["rm", kept.to_str().unwrap()]);
    assert!(ok, "{err}");
    crate::copies::check(&ds, dir.path(), &[], "lors rm of the copy");
}

/// A sparse file on the mount: `lseek` finds its data and its holes
/// (SEEK_DATA, SEEK_HOLE) as on a local file system, its holes read as
/// zeros, and `cp` makes a sparse copy equal to the source.
#[test]
fn a_sparse_file_on_the_mount_shows_its_holes_to_lseek() {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: /dev/fuse is absent on this machine, so nothing can be mounted");
        return;
    }
    let dir = tempdir();
    let d = DepotProc::start(&dir.path().join("d"), &[]);
    let root = dir.path();
    let (xnds, mnt) = (root.join("x"), root.join("m"));
    std::fs::create_dir(&xnds).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let src = root.join("src");
    let f = std::fs::File::create(&src).unwrap();
    f.set_len(32 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &pattern(1 << 20, 8), 8 << 20).unwrap();
    drop(f);
    if crate::sparse::upload_sparse(&d.addr, &src, &xnds.join("img.xnd"), &[]).is_none() {
        return;
    }
    let _m = Mount::start(&xnds, &mnt, &["--depot", &d.addr]);
    // What lseek says of the source and of the mounted file, alike.
    let probe = |p: &Path| {
        sh(
            &format!(
                "python3 -c 'import os; fd = os.open(\"{}\", os.O_RDONLY); \
                 print(*(os.lseek(fd, o, w) for o, w in ((0, os.SEEK_DATA), (0, os.SEEK_HOLE), \
                 ((8 << 20) + 5, os.SEEK_HOLE), ((8 << 20) + 5, os.SEEK_DATA))))'",
                p.display()
            ),
            root,
        )
    };
    let on_mount = probe(&mnt.join("img"));
    assert_eq!(on_mount, probe(&src), "lseek on the mount");
    let want = format!("{} 0 {} {}", 8 << 20, 9 << 20, (8 << 20) + 5);
    assert_eq!(on_mount.trim(), want);
    // After the data, the file's last 4 KiB (always stored).
    let tail = sh(
        &format!(
            "python3 -c 'import os; print(os.lseek(os.open(\"{}\", os.O_RDONLY), (9 << 20) + 1, os.SEEK_DATA))'",
            mnt.join("img").display()
        ),
        root,
    );
    assert_eq!(tail.trim(), ((32u64 << 20) - 4096).to_string());
    // Past the end, and data asked for in the trailing hole: ENXIO.
    sh(
        &format!(
            "python3 -c 'import os, errno; fd = os.open(\"{}\", os.O_RDONLY)\n\
             try:\n    os.lseek(fd, 32 << 20, os.SEEK_DATA); raise SystemExit(1)\n\
             except OSError as e:\n    assert e.errno == errno.ENXIO, e'",
            mnt.join("img").display()
        ),
        root,
    );
    sh("cp --sparse=always m/img copy && cmp copy src", root);
    let copy = std::fs::metadata(root.join("copy")).unwrap();
    assert!(std::os::unix::fs::MetadataExt::blocks(&copy) * 512 < 4 << 20);
}

/// What ordinary programs rely on, on the mount beside a local directory:
/// `O_CREAT|O_RDONLY` creates (`flock FILE`); names up to the limit
/// `statvfs` gives work and longer ones fail at once with ENAMETOOLONG (not
/// EIO at close); growing a file records a hole (nothing stored), reads
/// give its zeros, writes into it land, and past the largest size EFBIG;
/// with three depots and two copies, every depot gets its share.
#[test]
fn mount_creates_read_only_names_to_its_limit_grows_by_holes_and_uses_every_depot() {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("skipped: /dev/fuse is absent on this machine, so nothing can be mounted");
        return;
    }
    let dir = tempdir();
    let root = dir.path();
    let ds: Vec<DepotProc> = (0..3)
        .map(|i| DepotProc::start(&root.join(format!("d{i}")), &[]))
        .collect();
    let (xnds, mnt, local) = (root.join("x"), root.join("m"), root.join("local"));
    for p in [&xnds, &mnt, &local] {
        std::fs::create_dir(p).unwrap();
    }
    let depots: Vec<&str> = ds.iter().map(|d| d.addr.as_str()).collect();
    let list = depots.join(",");
    let _m = Mount::start(&xnds, &mnt, &["--depot", &list, "-c", "2", "-B", "1M"]);

    // `flock -n FILE true` opens O_CREAT|O_RDONLY: the file is made.
    sh("flock -n m/lk true && flock -n local/lk true", root);
    assert_eq!(std::fs::metadata(mnt.join("lk")).unwrap().len(), 0);
    assert!(xnds.join("lk.xnd").is_file());

    // Names: what statvfs says holds, one byte more does not, at once.
    let names = r#"
import errno, os, sys
base = sys.argv[1]
limit = os.statvfs(base).f_namemax
out = [str(limit)]
for n in (limit, limit + 1, 256):
    p = os.path.join(base, "n" * n)
    try:
        with open(p, "wb") as f:
            f.write(b"x" * 100)
        out.append("ok:%d" % os.path.getsize(p))
    except OSError as e:
        out.append(errno.errorcode[e.errno])
print(" ".join(out))
"#;
    std::fs::write(root.join("names.py"), names).unwrap();
    let got = sh("python3 names.py m", root);
    let want = format!("{} ok:100 ENAMETOOLONG ENAMETOOLONG", lors_fuse::NAME_MAX);
    assert_eq!(got.trim(), want);

    // Growth is a hole: 256 MiB of size, nothing stored; a write into
    // the middle lands; the file reads as the local one does.
    let before: u64 = ds.iter().map(used).sum();
    let grow = "truncate -s 256M {d}/big && \
                printf 'in the hole' | dd of={d}/big bs=1 seek=100000000 conv=notrunc status=none && \
                truncate -s 300M {d}/big";
    sh(&grow.replace("{d}", "m"), root);
    sh(&grow.replace("{d}", "local"), root);
    assert_eq!(std::fs::metadata(mnt.join("big")).unwrap().len(), 300 << 20);
    let stored = ds.iter().map(used).sum::<u64>() - before;
    assert!(
        stored < 8 << 20,
        "growing by 300 MiB stored {stored} bytes on the depots"
    );
    sh("cmp m/big local/big", root);

    // Sizes: far is a hole too; past the largest file, EFBIG.
    let far = format!(
        "python3 -c 'import os, errno\nos.truncate(\"m/far\" if os.path.exists(\"m/far\") else open(\"m/far\", \"wb\").name, 999999999999999)\nprint(os.path.getsize(\"m/far\"))\ntry:\n    os.truncate(\"m/far\", {})\nexcept OSError as e:\n    print(errno.errorcode[e.errno])'",
        lors::xio::MAX_FILE_SIZE + 1
    );
    assert_eq!(sh(&far, root).trim(), "999999999999999\nEFBIG");

    // Placement: 12 blocks of two copies over three depots: all get some.
    sh(
        "head -c 12582912 /dev/urandom > local/spread && cp local/spread m/spread && cmp m/spread local/spread",
        root,
    );
    for (i, d) in ds.iter().enumerate() {
        assert!(
            crate::tools::usage(d).1 >= 4,
            "depot {i} holds {} allocations",
            crate::tools::usage(d).1
        );
    }
}
