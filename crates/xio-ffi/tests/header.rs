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
    // Anywhere outside a /* */ comment (`#endif // x` too).
    let (mut code, mut rest, mut line) = (Vec::new(), h, 1);
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("/*") {
            let end = after.find("*/").map_or(after.len(), |e| e + 2);
            line += after[..end].matches('\n').count();
            rest = &after[end..];
        } else if rest.starts_with("//") {
            code.push(h.lines().nth(line - 1).unwrap_or_default());
            rest = &rest[2..];
        } else {
            let c = rest.chars().next().unwrap_or_default();
            line += usize::from(c == '\n');
            rest = &rest[c.len_utf8()..];
        }
    }
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
        std::fs::write(
            dir.join("t.c"),
            "#include \"xio.h\"\nint main(void) { return xio_close(-1) == -1 ? 0 : 1; }\n",
        )
        .unwrap();
        let out = std::process::Command::new("g++")
            .args(["-fsyntax-only", "-Wall", "-Werror", "t.cpp"])
            .current_dir(&dir)
            .output()
            .unwrap();
        // And a C89 compiler, pedantic.
        let c89 = std::process::Command::new("gcc")
            .args([
                "-std=c89",
                "-pedantic",
                "-Wall",
                "-Werror",
                "-fsyntax-only",
                "t.c",
            ])
            .current_dir(&dir)
            .output();
        let _ = std::fs::remove_dir_all(&dir);
        if let Ok(c89) = c89 {
            assert!(
                c89.status.success(),
                "{}",
                String::from_utf8_lossy(&c89.stderr)
            );
        }
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
