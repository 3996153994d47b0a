//! Writes `xio.h` (from the `extern "C"` functions of `src/lib.rs`) to
//! `OUT_DIR` and to `include/` beside `libxio.so` in the target directory,
//! and `xio.pc` for pkg-config beside it.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=src/lib.rs");
    println!("cargo:rerun-if-changed=cbindgen.toml");
    let crate_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("crates/xio-ffi/cbindgen.toml is valid");
    let header = cbindgen::generate_with_config(&crate_dir, config)
        .expect("generating xio.h from src/lib.rs");
    // cbindgen ends its C++ guards with `// __cplusplus` comments, which C89
    // compilers warn about (or refuse with -pedantic-errors).
    let mut text = Vec::new();
    header.write(&mut text);
    let text = String::from_utf8(text)
        .expect("xio.h is UTF-8")
        .replace("// __cplusplus", "/* __cplusplus */")
        .replace("// extern \"C\"", "/* extern \"C\" */");
    let write = |path: PathBuf| {
        if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            std::fs::write(&path, &text).expect("writing xio.h");
        }
    };
    write(out.join("xio.h"));
    // OUT_DIR is TARGET/PROFILE/build/PKG-HASH/out: the header goes to
    // TARGET/PROFILE/include/xio.h, next to libxio.so.
    if let Some(profile_dir) = out.ancestors().nth(3) {
        let inc = profile_dir.join("include");
        if std::fs::create_dir_all(&inc).is_ok() {
            write(inc.join("xio.h"));
        }
        // `pkg-config --cflags --libs xio` with PKG_CONFIG_PATH set to the
        // profile directory: the flags to build against this build.
        let pc = format!(
            "prefix={}\nlibdir=${{prefix}}\nincludedir=${{prefix}}/include\n\n\
             Name: xio\nDescription: LoRS xio: exNodes read and written as files\n\
             Version: {}\nLibs: -L${{libdir}} -Wl,-rpath,${{libdir}} -lxio\n\
             Cflags: -I${{includedir}}\n",
            profile_dir.display(),
            std::env::var("CARGO_PKG_VERSION").unwrap_or_default()
        );
        let _ = std::fs::write(profile_dir.join("xio.pc"), pc);
    }
}
