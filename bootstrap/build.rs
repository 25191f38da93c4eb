//! With the `pmix` feature: find the system's OpenPMIx (pkg-config name `pmix`; Debian's
//! `libpmix-dev`), link it, and generate bindings for the few client calls
//! `src/pmix/ffi.rs` uses. Bindgen reads the installed header, so the structs' layout is
//! the library's own; bindgen's layout tests check it against clang's view of the header.
//! Without the feature this script does nothing.

#[cfg(feature = "pmix")]
use std::{env, path::PathBuf, process::Command};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "pmix")]
    pmix();
}

#[cfg(feature = "pmix")]
fn pmix() {
    println!("cargo:rerun-if-env-changed=RVERBS_PMIX_DIR");
    let (include_dirs, lib_dirs) = locate();
    for dir in &lib_dirs {
        println!("cargo:rustc-link-search=native={}", dir.display());
    }
    println!("cargo:rustc-link-lib=dylib=pmix");

    let header = include_dirs
        .iter()
        .map(|dir| dir.join("pmix.h"))
        .find(|path| path.is_file())
        .unwrap_or_else(|| {
            panic!(
                "feature `pmix`: no pmix.h under {include_dirs:?}; install libpmix-dev \
                 (tools/setup does) or set RVERBS_PMIX_DIR to an OpenPMIx prefix"
            )
        });
    println!("cargo:rerun-if-changed={}", header.display());
    let mut builder = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .allowlist_function("PMIx_(Init|Finalize|Put|Commit|Fence|Get|Error_string|Info_load|Value_destruct|Get_version)")
        .allowlist_type("pmix_(proc|info|value|byte_object)_t")
        .allowlist_var("PMIX_(SUCCESS|ERR_TIMEOUT|ERR_NOT_FOUND|ERR_UNREACH|ERR_INIT|ERR_LOST_CONNECTION|GLOBAL|BOOL|INT|UINT16|UINT32|BYTE_OBJECT|TIMEOUT|COLLECT_DATA|JOB_SIZE|LOCAL_RANK|LOCAL_SIZE|MAX_NSLEN|MAX_KEYLEN)")
        .size_t_is_usize(true)
        .layout_tests(true)
        .derive_debug(false)
        .generate_comments(false);
    for dir in &include_dirs {
        builder = builder.clang_arg(format!("-I{}", dir.display()));
    }
    let bindings = builder
        .generate()
        .expect("feature `pmix`: bindgen could not read pmix.h");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .write_to_file(out.join("pmix_bindings.rs"))
        .expect("feature `pmix`: cannot write the bindings");
}

#[cfg(feature = "pmix")]
/// Include and library directories: `RVERBS_PMIX_DIR` (a prefix with `include/` and
/// `lib/`), else pkg-config's answer for `pmix`, else Debian's location.
fn locate() -> (Vec<PathBuf>, Vec<PathBuf>) {
    if let Some(prefix) = env::var_os("RVERBS_PMIX_DIR") {
        let prefix = PathBuf::from(prefix);
        return (vec![prefix.join("include")], vec![prefix.join("lib")]);
    }
    let pkg = Command::new("pkg-config")
        .args(["--cflags-only-I", "--libs-only-L", "pmix"])
        .output();
    if let Ok(out) = pkg {
        if out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let mut include = Vec::new();
            let mut lib = Vec::new();
            for word in text.split_whitespace() {
                if let Some(dir) = word.strip_prefix("-I") {
                    include.push(PathBuf::from(dir));
                } else if let Some(dir) = word.strip_prefix("-L") {
                    lib.push(PathBuf::from(dir));
                }
            }
            if !include.is_empty() {
                return (include, lib);
            }
        }
    }
    let debian = PathBuf::from("/usr/lib/x86_64-linux-gnu/pmix2");
    (vec![debian.join("include")], vec![debian.join("lib")])
}
