//! libxio: the C API of "IBP Deployment Tests and Integration with DiDaS Project" §6 over [`lors::xio`].
//!
//! Paths starting with `lors://` name exNodes (`lors:///run42.xnd` is
//! `run42.xnd` in the current directory, `lors:////data/run42.xnd` an
//! absolute path; `lors://LBONE/…?copies=2&bs=10` adds an L-Bone and
//! settings, as for the tools). Every other path is passed to the operating
//! system unchanged, so a program can switch all its I/O to `xio_*` calls.
//! Descriptors of exNodes are real descriptor numbers (of `/dev/null`,
//! held open while the exNode is), so they never collide with the
//! program's own. Errors return -1 and set `errno`: `ENOENT`, `EACCES`,
//! `EROFS` (an exNode with no write capability), `ENOSPC` (no depot takes
//! the data), `EIO` (a block no replica can deliver), `EBADF`, `EINVAL`.
//!
//! Unlike the original libxio, `O_RDWR` works. Data written is stored in
//! 10 MiB blocks as the buffer fills; `xio_fsync` or `xio_close` stores the
//! rest and writes the `.xnd` file atomically.
//!
//! ```c
//! #include <xio.h>
//! #include <fcntl.h>
//! int fd = xio_open("lors:///frames.xnd?copies=2", O_WRONLY | O_CREAT | O_TRUNC);
//! xio_write(fd, frame, frame_len);      /* as often as you like */
//! if (xio_close(fd) < 0) perror("frames.xnd");
//! ```

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::io::{self, ErrorKind, Read, Seek, SeekFrom, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use libc::{mode_t, off_t, size_t, ssize_t, stat};
use lors::xio::{self, OpenOptions};

type Table = HashMap<c_int, Arc<Mutex<xio::File>>>;

fn table() -> MutexGuard<'static, Table> {
    static FILES: OnceLock<Mutex<Table>> = OnceLock::new();
    FILES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

fn lookup(fd: c_int) -> Option<Arc<Mutex<xio::File>>> {
    table().get(&fd).cloned()
}

fn set_errno(e: c_int) {
    // SAFETY: errno is this thread's; the location is always valid.
    unsafe { *libc::__errno_location() = e };
}

/// Runs `f`; an error (or a panic, which must not cross into C) becomes
/// `errno` and `fail`.
fn guard<T>(fail: T, f: impl FnOnce() -> io::Result<T>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            if std::env::var_os("XIO_DEBUG").is_some() {
                eprintln!("xio: {e}");
            }
            set_errno(xio::errno(&e));
            fail
        }
        Err(_) => {
            set_errno(libc::EIO);
            fail
        }
    }
}

/// A C string from the caller, or `None` for NULL.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn c_str<'a>(p: *const c_char) -> io::Result<&'a str> {
    if p.is_null() {
        return Err(io::Error::from_raw_os_error(libc::EFAULT));
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn is_lors(path: &str) -> bool {
    path.starts_with("lors://")
}

/// Opens `pathname` as `open(2)` does with `flags`; files it creates get
/// mode 0666 less the umask. See [`xio_open_mode`].
///
/// # Safety
/// `pathname` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xio_open(pathname: *const c_char, flags: c_int) -> c_int {
    // SAFETY: as this function's contract.
    unsafe { xio_open_mode(pathname, flags, 0o666) }
}

/// `open(2)` with an explicit mode for a local file it creates (`lors://`
/// exNodes are always written owner-only: they hold capabilities).
///
/// # Safety
/// `pathname` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xio_open_mode(
    pathname: *const c_char,
    flags: c_int,
    mode: mode_t,
) -> c_int {
    if pathname.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: checked non-null; the caller passes a NUL-terminated string.
    let s = match unsafe { c_str(pathname) } {
        Ok(s) => s,
        Err(e) => {
            set_errno(xio::errno(&e));
            return -1;
        }
    };
    if !is_lors(s) {
        // SAFETY: a valid C string; open(2) with a mode argument.
        return unsafe { libc::open(pathname, flags, mode as libc::c_uint) };
    }
    guard(-1, || {
        let mut o = OpenOptions::new();
        match flags & libc::O_ACCMODE {
            libc::O_RDONLY => o.read(true),
            libc::O_WRONLY => o.write(true),
            libc::O_RDWR => o.read(true).write(true),
            _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
        };
        o.append(flags & libc::O_APPEND != 0)
            .create(flags & libc::O_CREAT != 0)
            .create_new(flags & libc::O_CREAT != 0 && flags & libc::O_EXCL != 0)
            .truncate(flags & libc::O_TRUNC != 0);
        let f = o.open(s)?;
        // A real descriptor number, so it never collides with the program's.
        // SAFETY: a constant C string.
        let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        table().insert(fd, Arc::new(Mutex::new(f)));
        Ok(fd)
    })
}

/// Closes `fd`. For an exNode: stores what is buffered and writes the
/// `.xnd`; -1 with `errno` if that fails (the descriptor is closed anyway,
/// and the `.xnd` on disk is the last one written whole).
#[unsafe(no_mangle)]
pub extern "C" fn xio_close(fd: c_int) -> c_int {
    let Some(f) = table().remove(&fd) else {
        // SAFETY: closing a descriptor number is safe whatever it is.
        return unsafe { libc::close(fd) };
    };
    let r = guard(-1, || {
        let f = Arc::try_unwrap(f)
            .map_err(|_| io::Error::from_raw_os_error(libc::EBUSY))?
            .into_inner()
            .unwrap_or_else(|e| e.into_inner());
        f.close().map(|()| 0)
    });
    // SAFETY: our placeholder descriptor.
    unsafe { libc::close(fd) };
    r
}

/// Runs `f` on the exNode file behind `fd`, or `local` for an OS descriptor.
fn with_file<T>(
    fd: c_int,
    fail: T,
    f: impl FnOnce(&mut xio::File) -> io::Result<T>,
    local: impl FnOnce() -> T,
) -> T {
    match lookup(fd) {
        Some(file) => guard(fail, || {
            f(&mut file.lock().unwrap_or_else(|e| e.into_inner()))
        }),
        None => local(),
    }
}

/// `read(2)`: for an exNode, `count` bytes unless the file ends first.
///
/// # Safety
/// `buf` points to `count` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xio_read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    with_file(
        fd,
        -1,
        |f| {
            if count == 0 {
                return Ok(0);
            }
            // SAFETY: the caller's buffer of `count` bytes.
            let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), count) };
            Ok(f.read(out)? as ssize_t)
        },
        // SAFETY: as the caller's contract.
        || unsafe { libc::read(fd, buf, count) },
    )
}

/// `write(2)`: for an exNode, all `count` bytes are buffered (and stored
/// as the buffer fills) or -1.
///
/// # Safety
/// `buf` points to `count` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xio_write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    with_file(
        fd,
        -1,
        |f| {
            if count == 0 {
                return Ok(0);
            }
            // SAFETY: the caller's buffer of `count` bytes.
            let data = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), count) };
            f.write_all(data)?;
            Ok(count as ssize_t)
        },
        // SAFETY: as the caller's contract.
        || unsafe { libc::write(fd, buf, count) },
    )
}

/// `lseek(2)` with `SEEK_SET`, `SEEK_CUR`, `SEEK_END`.
#[unsafe(no_mangle)]
pub extern "C" fn xio_lseek(fd: c_int, offset: off_t, whence: c_int) -> off_t {
    with_file(
        fd,
        -1,
        |f| {
            let to = match whence {
                libc::SEEK_SET => SeekFrom::Start(
                    u64::try_from(offset)
                        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?,
                ),
                libc::SEEK_CUR => SeekFrom::Current(offset),
                libc::SEEK_END => SeekFrom::End(offset),
                _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
            };
            let n = f.seek(to)?;
            off_t::try_from(n).map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))
        },
        // SAFETY: no pointers.
        || unsafe { libc::lseek(fd, offset, whence) },
    )
}

/// `ftruncate(2)`: shrinking drops the data past `length`, growing adds
/// zeros.
#[unsafe(no_mangle)]
pub extern "C" fn xio_ftruncate(fd: c_int, length: off_t) -> c_int {
    with_file(
        fd,
        -1,
        |f| {
            let n =
                u64::try_from(length).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
            f.set_len(n).map(|()| 0)
        },
        // SAFETY: no pointers.
        || unsafe { libc::ftruncate(fd, length) },
    )
}

/// `fsync(2)`: for an exNode, stores what is buffered and writes the `.xnd`.
#[unsafe(no_mangle)]
pub extern "C" fn xio_fsync(fd: c_int) -> c_int {
    with_file(
        fd,
        -1,
        |f| f.sync_all().map(|()| 0),
        // SAFETY: no pointers.
        || unsafe { libc::fsync(fd) },
    )
}

/// Fills `buf` for an exNode: the `.xnd` file's owner, device and inode,
/// with the logical size, data modification time and permissions.
fn fill(xnd: &std::path::Path, m: &xio::Metadata, buf: *mut stat) -> io::Result<c_int> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(xnd.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a valid C string and the caller's stat buffer.
    if unsafe { libc::stat(c.as_ptr(), buf) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let secs = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH).map_or((0, 0), |d| {
            (d.as_secs() as libc::time_t, i64::from(d.subsec_nanos()))
        })
    };
    // SAFETY: the caller's stat buffer, filled above.
    let st = unsafe { &mut *buf };
    st.st_mode = libc::S_IFREG | m.permissions;
    st.st_size = off_t::try_from(m.len).unwrap_or(off_t::MAX);
    st.st_blocks = (m.len.div_ceil(512)) as libc::blkcnt_t;
    st.st_blksize = 1 << 20;
    (st.st_mtime, st.st_mtime_nsec) = secs(m.modified);
    (st.st_atime, st.st_atime_nsec) = secs(m.accessed);
    Ok(0)
}

/// `stat(2)`: for a `lors://` path, the exNode's logical size and times.
///
/// # Safety
/// `file_name` is a NUL-terminated string; `buf` points to a `struct stat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xio_stat(file_name: *const c_char, buf: *mut stat) -> c_int {
    // SAFETY: as this function's contract.
    unsafe { stat_path(file_name, buf, false) }
}

/// `lstat(2)`: as [`xio_stat`] for `lors://` paths (an exNode is not a link).
///
/// # Safety
/// `file_name` is a NUL-terminated string; `buf` points to a `struct stat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xio_lstat(file_name: *const c_char, buf: *mut stat) -> c_int {
    // SAFETY: as this function's contract.
    unsafe { stat_path(file_name, buf, true) }
}

/// # Safety
/// As [`xio_stat`].
unsafe fn stat_path(file_name: *const c_char, buf: *mut stat, link: bool) -> c_int {
    if buf.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    guard(-1, || {
        // SAFETY: the caller's string.
        let s = unsafe { c_str(file_name) }?;
        if !is_lors(s) {
            // SAFETY: a valid C string and stat buffer.
            let r = unsafe {
                if link {
                    libc::lstat(file_name, buf)
                } else {
                    libc::stat(file_name, buf)
                }
            };
            return if r < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(r)
            };
        }
        let m = xio::stat(s)?;
        let r = lors::uri::ExnodeRef::parse(s)
            .map_err(|e| io::Error::new(ErrorKind::InvalidInput, e))?;
        fill(&r.path, &m, buf)
    })
}

/// `fstat(2)`: for an exNode, the size includes what is still buffered.
///
/// # Safety
/// `buf` points to a `struct stat`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xio_fstat(fd: c_int, buf: *mut stat) -> c_int {
    if buf.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    with_file(
        fd,
        -1,
        |f| {
            let m = f.metadata()?;
            fill(f.path(), &m, buf)
        },
        // SAFETY: the caller's stat buffer.
        || unsafe { libc::fstat(fd, buf) },
    )
}
