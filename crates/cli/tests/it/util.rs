//! Test harness: start real depot processes and talk to them.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use lors_ibp::{ClientConfig, Connection};

/// A running `lors depot` child process.
pub struct DepotProc {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// The port.
    pub port: u16,
    /// Metrics address, when enabled.
    pub metrics: Option<String>,
}

/// A temporary directory that lives as long as the test.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("lors-it-")
        .tempdir()
        .unwrap()
}

impl DepotProc {
    /// Starts a depot on `--data <data>` with extra flags; `--listen
    /// 127.0.0.1:0` unless the flags give one.
    pub fn start(data: &Path, extra: &[&str]) -> DepotProc {
        Self::start_in(&[], data, extra)
    }

    /// As [`DepotProc::start`], run through the command prefix `wrap` (e.g.
    /// `ip netns exec NS`).
    pub fn start_in(wrap: &[String], data: &Path, extra: &[&str]) -> DepotProc {
        let mut args: Vec<String> = vec!["depot".into()];
        if !extra.contains(&"--config") {
            args.push("--data".into());
            args.push(data.display().to_string());
        }
        if !extra.contains(&"--listen") {
            args.push("--listen".into());
            args.push("127.0.0.1:0".into());
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let (child, lines) = spawn_ready(wrap, &args, "lors depot: ready");
        let mut addr = None;
        let mut metrics = None;
        for line in &lines {
            if let Some(a) = line.strip_prefix("lors depot: serving IBP on ") {
                addr = Some(a.trim().to_owned());
            } else if let Some(m) = line.strip_prefix("lors depot: metrics on http://") {
                metrics = Some(m.trim_end_matches("/metrics").to_owned());
            }
        }
        let addr = addr.expect("depot printed its address");
        let port = addr.rsplit(':').next().unwrap().parse().unwrap();
        DepotProc {
            child,
            addr,
            port,
            metrics,
        }
    }

    /// SIGKILL, no cleanup, as a crash.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait for the exit: a clean shutdown.
    pub fn terminate(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }

    /// The depot's process id (under a `wrap` that execs, the shell's).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (`STOP`, `CONT`, …) to the depot process: `STOP`
    /// freezes it with its sockets open, a depot that stalls.
    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{signal} failed");
    }

    /// A fresh client connection.
    pub async fn connect(&self) -> Connection {
        Connection::connect(&self.addr, &client_cfg())
            .await
            .expect("connect to depot")
    }
}

impl Drop for DepotProc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Starts `[WRAP…] lors ARGS…` and collects its stdout lines up to `ready`.
fn spawn_ready(wrap: &[String], args: &[String], ready: &str) -> (Child, Vec<String>) {
    spawn_logging(wrap, args, ready, "warn", Stdio::inherit())
}

/// As [`spawn_ready`], logging at `level` to `stderr`.
fn spawn_logging(
    wrap: &[String],
    args: &[String],
    ready: &str,
    level: &str,
    stderr: Stdio,
) -> (Child, Vec<String>) {
    let mut cmd = match wrap.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(env!("CARGO_BIN_EXE_lors"));
            c
        }
        None => Command::new(env!("CARGO_BIN_EXE_lors")),
    };
    let mut child = cmd
        .args(args)
        .env("RUST_LOG", level)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("spawn lors");
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) if line == ready => return (child, lines),
            Ok(line) => lines.push(line),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("`lors {}` did not print {ready:?} within 30s", args[0]);
            }
        }
    }
}

/// A running `lors lbone` child process.
pub struct LboneProc {
    child: Child,
    /// HTTP API address, `127.0.0.1:PORT`.
    pub http: String,
    /// Legacy protocol address.
    pub legacy: String,
    /// Its registration token.
    pub token: String,
    /// Whether it serves over TLS.
    pub tls: bool,
}

impl LboneProc {
    /// Starts an L-Bone on SQLite in `data`, loopback ports, with `extra`
    /// flags (a fixed token unless they give `--token-file`).
    pub fn start(data: &Path, extra: &[&str]) -> LboneProc {
        Self::start_with(data, extra, "warn", Stdio::inherit())
    }

    /// As [`LboneProc::start`], its log at info level in `log`.
    pub fn start_logging(data: &Path, extra: &[&str], log: &Path) -> LboneProc {
        let f = std::fs::File::create(log).unwrap();
        Self::start_with(data, extra, "info", Stdio::from(f))
    }

    fn start_with(data: &Path, extra: &[&str], level: &str, stderr: Stdio) -> LboneProc {
        let token = match extra.iter().position(|a| *a == "--token-file") {
            Some(i) => std::fs::read_to_string(extra[i + 1])
                .unwrap()
                .trim()
                .to_owned(),
            None => "test-token-0123456789".to_string(),
        };
        let data = data.display().to_string();
        let mut args: Vec<String> = [
            "lbone",
            "--data",
            &data,
            "--listen",
            "127.0.0.1:0",
            "--legacy-listen",
            "127.0.0.1:0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if !extra.contains(&"--token-file") {
            args.extend(["--token".to_string(), token.clone()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let (child, lines) = spawn_logging(&[], &args, "lors lbone: ready", level, stderr);
        let find = |prefix: &str| {
            lines
                .iter()
                .find_map(|l| l.strip_prefix(prefix))
                .unwrap_or_else(|| panic!("no {prefix:?} line in {lines:?}"))
                .trim()
                .trim_end_matches('/')
                .to_owned()
        };
        let tls = lines
            .iter()
            .any(|l| l.starts_with("lors lbone: dashboard https://"));
        LboneProc {
            http: find(if tls {
                "lors lbone: dashboard https://"
            } else {
                "lors lbone: dashboard http://"
            }),
            legacy: find("lors lbone: legacy protocol on "),
            tls,
            child,
            token,
        }
    }

    /// `http://ADDR` (`https://` over TLS).
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.http)
    }

    /// The L-Bone's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` (`KILL`, `STOP`, `CONT`, …).
    pub fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{signal} failed");
    }
}

/// A memory figure of process `pid` from `/proc/PID/status` (`VmRSS`,
/// `VmHWM` — the peak), in bytes.
pub fn memory_of(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    kib * 1024
}

impl Drop for LboneProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `lors ARGS…`, returning (success, stdout, stderr).
pub fn lors(args: &[&str]) -> (bool, Vec<u8>, String) {
    lors_env(args, &[])
}

/// `lors ARGS…` as tests run it: warnings only, and none of the caller's
/// L-Bone settings.
pub fn lors_cmd<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_lors"));
    cmd.args(args)
        .env("RUST_LOG", "warn")
        .env_remove("LBONE_SERVER")
        .env_remove("LBONE_PORT");
    cmd
}

/// Runs `lors ARGS…` with extra environment variables (and none of the
/// caller's L-Bone settings or ~/.xndrc unless given).
pub fn lors_env(args: &[&str], env: &[(&str, &str)]) -> (bool, Vec<u8>, String) {
    let mut cmd = lors_cmd(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run lors");
    (
        out.status.success(),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `lors ARGS…` (stdout discarded), killing it after `limit`:
/// `None` when it had to be killed (a hang), else (success, stderr).
pub fn lors_within(args: &[&str], limit: Duration) -> Option<(bool, String)> {
    lors_within_env(args, &[], limit)
}

/// [`lors_within`] with extra environment variables.
pub fn lors_within_env(
    args: &[&str],
    env: &[(&str, &str)],
    limit: Duration,
) -> Option<(bool, String)> {
    let mut cmd = lors_cmd(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run lors");
    let mut stderr = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break Some(st);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = reader.join().expect("stderr reader");
    status.map(|st| (st.success(), err))
}

/// Client settings for tests: short deadlines so a hang fails fast.
pub fn client_cfg() -> ClientConfig {
    ClientConfig {
        connect_timeout: Duration::from_secs(5),
        io_timeout: Duration::from_secs(20),
        ..ClientConfig::default()
    }
}

/// Deterministic test bytes.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A raw line-oriented socket for byte-exact protocol checks.
pub struct Raw {
    pub rd: tokio::io::BufReader<tokio::net::TcpStream>,
}

impl Raw {
    pub async fn connect(addr: &str) -> Raw {
        let s = tokio::net::TcpStream::connect(addr).await.unwrap();
        Raw {
            rd: tokio::io::BufReader::new(s),
        }
    }

    /// Connects from the local address `from` (any of 127.0.0.0/8 is ours),
    /// so a test can be two clients at once.
    pub async fn connect_from(addr: &str, from: &str) -> Raw {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind(format!("{from}:0").parse().unwrap()).unwrap();
        let s = sock.connect(addr.parse().unwrap()).await.unwrap();
        Raw {
            rd: tokio::io::BufReader::new(s),
        }
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        use tokio::io::AsyncWriteExt;
        self.rd.get_mut().write_all(bytes).await.unwrap();
    }

    /// Next line including `\n`; empty string at EOF.
    pub async fn line(&mut self) -> String {
        use tokio::io::AsyncBufReadExt;
        let mut s = String::new();
        tokio::time::timeout(Duration::from_secs(10), self.rd.read_line(&mut s))
            .await
            .expect("reply within 10s")
            .unwrap();
        s
    }

    pub async fn bytes(&mut self, n: usize) -> Vec<u8> {
        use tokio::io::AsyncReadExt;
        let mut b = vec![0; n];
        self.rd.read_exact(&mut b).await.unwrap();
        b
    }

    /// True once the depot has closed the connection.
    pub async fn closed(&mut self) -> bool {
        use tokio::io::AsyncReadExt;
        let mut b = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_secs(10), self.rd.read(&mut b)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }
}

/// `n` depots under `dir` (`d0`, `d1`, …), writing without syncs.
pub fn depots(n: usize, dir: &Path) -> Vec<DepotProc> {
    (0..n)
        .map(|i| DepotProc::start(&dir.join(format!("d{i}")), &["--sync", "never"]))
        .collect()
}

/// The depots' addresses as a `--depot` comma list.
pub fn list(ds: &[&DepotProc]) -> String {
    ds.iter()
        .map(|d| d.addr.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// `lors upload -q FLAGS` of `data` (written to `dir/name`) to the depots
/// `ds`; the exNode is `dir/name.xnd`.
pub fn upload(
    ds: &[&DepotProc],
    dir: &Path,
    name: &str,
    data: &[u8],
    flags: &[&str],
) -> std::path::PathBuf {
    let src = dir.join(name);
    std::fs::write(&src, data).unwrap();
    let xnd = dir.join(format!("{name}.xnd"));
    let depots = list(ds);
    let mut args = vec!["upload", "-q", "--depot", &depots, "-o"];
    args.push(xnd.to_str().unwrap());
    args.extend_from_slice(flags);
    args.push(src.to_str().unwrap());
    let (ok, _, err) = lors(&args);
    assert!(ok, "{err}");
    xnd
}

/// Flips a bit of byte `at` of mapping `m`'s data file on the disk of the
/// one of `ds` that holds it (depots started by [`depots`] under `dir`):
/// damage from outside the depot, as a rotting disk does it.
pub fn flip_stored_byte(ds: &[DepotProc], dir: &Path, m: &lors_exnode::Mapping, at: u64) {
    use std::os::unix::fs::FileExt;
    let di = (ds.iter())
        .position(|d| Some(&d.addr) == m.depot().as_ref())
        .expect("a depot of ds holds the mapping");
    let id: u64 = m.read.as_ref().unwrap().typekey.parse().unwrap();
    let file = (dir.join(format!("d{di}")).join("data"))
        .join(format!("{:02x}", id & 0xff))
        .join(format!("{id:016x}"));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x10], at).unwrap();
}

/// Frees every replica of the block at `offset` of the exNode `xnd` on
/// its depot, as a depot losing them would: `xnd` still names them.
pub fn free_block(xnd: &Path, offset: u64) {
    let x = lors::xnd::load(xnd).unwrap();
    let at: Vec<&lors_exnode::Mapping> = (x.mappings.iter())
        .filter(|m| m.exnode_offset == offset)
        .collect();
    assert!(!at.is_empty(), "no block at {offset}");
    free_allocations(&at);
}

/// Frees the allocations of `ms` on their depots (MANAGE DECR until the
/// depot has them no more, whoever held references), as a depot losing
/// them would.
pub fn free_allocations(ms: &[&lors_exnode::Mapping]) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        for m in ms {
            let cap = m.manage.as_ref().expect("a manage capability");
            let mut c = Connection::connect(&cap.address(), &client_cfg())
                .await
                .unwrap();
            while c.probe(cap).await.is_ok() {
                c.decr(cap, lors_ibp::CapKind::Read).await.unwrap();
            }
        }
    });
}

/// Frees mapping number `n` (as `lors ls` numbers them) of `xnd` on its
/// depot.
pub fn free_numbered(xnd: &Path, n: usize) {
    let x = lors::xnd::load(xnd).unwrap();
    let i = x.numbering().index(n).expect("a mapping of that number");
    free_allocations(&[x.allocation(i).unwrap()]);
}

/// Runs the shell `script` in a private mount namespace (`unshare -m`),
/// where it may mount a small tmpfs (exiting 77 when the mount fails):
/// its output, or `None` (said on stderr) where this machine allows no
/// private mounts.
pub fn in_private_mounts(script: &str) -> Option<std::process::Output> {
    let run = Command::new("unshare")
        .args(["-m", "sh", "-c", script])
        .output()
        .unwrap();
    // 77: no private mount; 126/127: no unshare; a signal: no code.
    if run.status.code().is_none_or(|c| c >= 77) {
        let err = String::from_utf8_lossy(&run.stderr);
        eprintln!("skipping: no private mounts here ({err})");
        return None;
    }
    Some(run)
}

/// `xnd` downloads (to `dir/out`, replaced) as exactly `data`.
pub fn assert_downloads(xnd: &Path, data: &[u8], dir: &Path) {
    let out = dir.join("out");
    let _ = std::fs::remove_file(&out);
    let (ok, _, err) = lors(&[
        "download",
        "-q",
        "-o",
        out.to_str().unwrap(),
        xnd.to_str().unwrap(),
    ]);
    assert!(ok, "{}: {err}", xnd.display());
    assert!(
        std::fs::read(&out).unwrap() == data,
        "{} differs",
        xnd.display()
    );
}
