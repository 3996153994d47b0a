//! The generated `xio.h` declares the calls of "IBP Deployment Tests and Integration with DiDaS Project" §6 with the C
//! types a program expects.

#[test]
fn header_declares_every_call_of_the_seed() {
    let h = include_str!(concat!(env!("OUT_DIR"), "/xio.h"));
    for decl in [
        "int xio_open(const char *pathname, int flags);",
        "int xio_close(int fd);",
        "ssize_t xio_read(int fd, void *buf, size_t count);",
        "ssize_t xio_write(int fd, const void *buf, size_t count);",
        "int xio_ftruncate(int fd, off_t length);",
        "off_t xio_lseek(int fd, off_t offset, int whence);",
        "int xio_stat(const char *file_name, struct stat *buf);",
        "int xio_fstat(int fd, struct stat *buf);",
        "int xio_lstat(const char *file_name, struct stat *buf);",
    ] {
        assert!(h.contains(decl), "xio.h lacks {decl}\n{h}");
    }
}
