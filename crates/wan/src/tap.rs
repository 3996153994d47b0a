//! TAP devices: Ethernet frames in and out of a descriptor.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd as _;

/// `ioctl(TUNSETIFF)`'s argument: `struct ifreq` with a name and flags.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Creates the TAP device `name` (frames without a packet-information
/// header) in this namespace and returns its descriptor. The device goes
/// when the descriptor is closed.
pub fn open(name: &str) -> io::Result<File> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short,
        _pad: [0; 22],
    };
    if name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "device names are under 16 bytes",
        ));
    }
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads and writes one `struct ifreq`, which `req`
    // is (40 bytes, name then flags), alive for the call.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), libc::TUNSETIFF, &mut req as *mut IfReq) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(f)
}

/// Asks the kernel to wake this process's timed waits on time (a timer
/// slack of 1 ns instead of 50 us): the wire's delays are waits.
pub fn precise_timers() {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument; no memory.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
}
