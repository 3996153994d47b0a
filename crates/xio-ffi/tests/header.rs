//! The generated `xio.h` declares the calls of "IBP Deployment Tests and Integration with DiDaS Project" §6 with the C
//! types a program expects.

#[test]
fn header_declares_every_call_of_the_paper() {
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

/// C++ programs include it as it is; its comments are C89's.
#[test]
fn header_serves_cpp_and_c89() {
    let h = include_str!(concat!(env!("OUT_DIR"), "/xio.h"));
    assert!(
        h.contains("#ifdef __cplusplus") && h.contains("extern \"C\" {"),
        "{h}"
    );
    let code: Vec<&str> = h
        .lines()
        .filter(|l| l.trim_start().starts_with("//"))
        .collect();
    assert!(code.is_empty(), "C99 comments: {code:?}");
    // A C++ compiler takes it, where one is installed.
    if std::process::Command::new("g++")
        .arg("--version")
        .output()
        .is_ok()
    {
        let dir = std::env::temp_dir().join(format!("xio-hpp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("xio.h"), h).unwrap();
        std::fs::write(
            dir.join("t.cpp"),
            "#include \"xio.h\"\nint main() { return xio_close(-1) == -1 ? 0 : 1; }\n",
        )
        .unwrap();
        let out = std::process::Command::new("g++")
            .args(["-fsyntax-only", "-Wall", "-Werror", "t.cpp"])
            .current_dir(&dir)
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
