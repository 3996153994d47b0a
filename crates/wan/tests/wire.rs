//! The wire between two network namespaces: frames arrive no earlier
//! than the delay says, every one at 0 % loss, none at 100 %. (How close
//! to the delay, and the loss rate's accuracy, are measured by the lab's
//! validation, not asserted here: timing on a shared machine flakes.)

use std::process::{Child, Command, Stdio};

/// Two namespaces joined by a `lors-wan` wire; removed when dropped.
struct Wire {
    child: Child,
    ns: [String; 2],
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .status()
        .is_ok_and(|s| s.success())
}

impl Wire {
    fn up(tag: &str, extra: &[&str]) -> Option<Wire> {
        let ns = [format!("lwt{tag}a"), format!("lwt{tag}b")];
        let taps = [format!("lwt{tag}0"), format!("lwt{tag}1")];
        for n in &ns {
            let _ = ip(&["netns", "del", n]);
            if !ip(&["netns", "add", n]) {
                return None;
            }
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_lors-wan"))
            .args(["--tap", &taps[0], "--tap", &taps[1]])
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        assert_eq!(line.trim(), "ready");
        for (i, (n, t)) in ns.iter().zip(&taps).enumerate() {
            let addr = format!("10.213.250.{}/24", i + 1);
            assert!(ip(&["link", "set", t, "netns", n]));
            assert!(ip(&["-n", n, "addr", "add", &addr, "dev", t]));
            assert!(ip(&["-n", n, "link", "set", t, "up"]));
        }
        Some(Wire { child, ns })
    }

    /// `ping -c COUNT` from the first namespace to the second: received
    /// replies and the least round trip in ms.
    fn ping(&self, count: u32) -> (u32, f64) {
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.ns[0],
                "ping",
                "-n",
                "-i",
                "0.05",
                "-W",
                "2",
            ])
            .args(["-c", &count.to_string(), "10.213.250.2"])
            .output()
            .expect("ping (Debian package iputils-ping)");
        let text = String::from_utf8_lossy(&out.stdout);
        let got = text.lines().filter(|l| l.contains("bytes from")).count() as u32;
        let least = (text.lines())
            .filter_map(|l| {
                l.split("time=")
                    .nth(1)?
                    .split(' ')
                    .next()?
                    .parse::<f64>()
                    .ok()
            })
            .fold(f64::INFINITY, f64::min);
        (got, least)
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for n in &self.ns {
            let _ = ip(&["netns", "del", n]);
        }
    }
}

#[test]
fn frames_cross_after_the_delay_and_loss_drops_them() {
    let Some(w) = Wire::up("d", &["--delay-ab", "15ms", "--delay-ba", "5ms"]) else {
        eprintln!("skipped: creating network namespaces needs root");
        return;
    };
    // The first ping also waits for ARP; all arrive.
    let (got, least) = w.ping(10);
    assert_eq!(got, 10, "no loss asked, none seen");
    assert!(least >= 20.0, "a round trip of 15 + 5 ms took {least} ms");
    drop(w);
    let w = Wire::up("l", &["--loss", "100"]).unwrap();
    assert_eq!(w.ping(3).0, 0, "every frame lost at 100 %");
}
