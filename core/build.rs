//! With the `rdmacm` feature: link the system's librdmacm (Debian `librdmacm-dev`) and
//! generate bindings for the few `rdma_*` calls and types `src/cm/ffi.rs` uses. Bindgen reads
//! the installed header, so the structs' layout is the library's own, and its layout tests
//! check it. The `ibv_*` types the header embeds are not generated again: the bindings name
//! `ibverbs-sys`'s, so an `ibv_qp_attr` filled by `rdma_init_qp_attr` is the one
//! `ibv_modify_qp` takes (the layout tests check those sizes too). Without the feature this
//! script does nothing.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "rdmacm")]
    rdmacm();
}

#[cfg(feature = "rdmacm")]
fn rdmacm() {
    use std::env;
    use std::path::PathBuf;

    println!("cargo:rerun-if-env-changed=RVERBS_RDMACM_DIR");
    // A prefix with include/ and lib/, else the system's (Debian: /usr).
    let (include, lib) = match env::var_os("RVERBS_RDMACM_DIR") {
        Some(prefix) => {
            let prefix = PathBuf::from(prefix);
            (prefix.join("include"), Some(prefix.join("lib")))
        }
        None => (PathBuf::from("/usr/include"), None),
    };
    if let Some(lib) = &lib {
        println!("cargo:rustc-link-search=native={}", lib.display());
    }
    println!("cargo:rustc-link-lib=dylib=rdmacm");
    let header = include.join("rdma/rdma_cma.h");
    assert!(
        header.is_file(),
        "feature `rdmacm`: no {} ; install librdmacm-dev (tools/setup does) or set \
         RVERBS_RDMACM_DIR to an rdma-core prefix",
        header.display()
    );
    println!("cargo:rerun-if-changed={}", header.display());
    let bindings = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .clang_arg(format!("-I{}", include.display()))
        .allowlist_function(
            "rdma_(create_event_channel|destroy_event_channel|create_id|destroy_id|bind_addr\
             |resolve_addr|resolve_route|connect|establish|listen|accept|reject|disconnect\
             |join_multicast|leave_multicast|get_cm_event|ack_cm_event|get_src_port\
             |migrate_id|init_qp_attr)",
        )
        // Exactly these types, no more: the `ibv_*` types they name come from ibverbs-sys
        // (brought in by `src/cm/ffi.rs`), and a path record is only ever behind a pointer.
        .allowlist_recursively(false)
        .allowlist_type(
            "rdma_(cm_id|cm_event|conn_param|ud_param|route|addr|ib_addr|event_channel\
             |port_space|cm_event_type)(__bindgen_ty_[0-9]+)*",
        )
        .allowlist_type("sockaddr(_in|_in6|_storage)?|in6?_addr.*|sa_family_t|in_port_t|in_addr_t")
        .allowlist_type("__be(16|32|64)|__u(16|32|64)|ibv_sa_path_rec")
        .opaque_type("ibv_sa_path_rec")
        .use_core()
        .ctypes_prefix("core::ffi")
        .constified_enum_module("rdma_port_space")
        .constified_enum_module("rdma_cm_event_type")
        .prepend_enum_name(false)
        .size_t_is_usize(true)
        .layout_tests(true)
        .derive_debug(false)
        .derive_default(false)
        .derive_copy(true)
        .generate_comments(false)
        .generate()
        .expect("feature `rdmacm`: bindgen could not read rdma_cma.h");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .write_to_file(out.join("rdmacm_bindings.rs"))
        .expect("feature `rdmacm`: cannot write the bindings");
}
