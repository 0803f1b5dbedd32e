//! Finds libfabric (>= 1.17) with pkg-config (`LIBFABRIC_HOME` first: its
//! `lib/pkgconfig` or `lib64/pkgconfig`, else its `include`/`lib` directly; then
//! `PKG_CONFIG_PATH` and the system's), compiles the C shim that gives
//! libfabric's static inline API real symbols, and (feature `bindgen`)
//! regenerates the bindings against the headers found.

use std::path::PathBuf;

const MIN_VERSION: &str = "1.17";

fn main() {
    println!("cargo:rerun-if-changed=shim/shim.c");
    println!("cargo:rerun-if-changed=shim/shim.h");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=LIBFABRIC_HOME");

    let home = std::env::var_os("LIBFABRIC_HOME").map(PathBuf::from);
    if let Some(home) = &home {
        // The site's libfabric (e.g. the cxi build on a Cray) wins over the system's.
        let dirs: Vec<PathBuf> = ["lib/pkgconfig", "lib64/pkgconfig"]
            .iter()
            .map(|d| home.join(d))
            .filter(|d| d.join("libfabric.pc").is_file())
            .collect();
        if !dirs.is_empty() {
            let mut paths = dirs;
            if let Some(old) = std::env::var_os("PKG_CONFIG_PATH") {
                paths.extend(std::env::split_paths(&old));
            }
            let joined = std::env::join_paths(paths).expect("pkg-config paths join");
            // A build script is one thread; pkg-config reads this just below.
            std::env::set_var("PKG_CONFIG_PATH", joined);
        }
    }

    let include_paths = match pkg_config::Config::new()
        .atleast_version(MIN_VERSION)
        .probe("libfabric")
    {
        Ok(lib) => lib.include_paths,
        Err(e) => match home.as_deref().and_then(without_pkg_config) {
            Some(include) => vec![include],
            None => panic!(
                "libfabric >= {MIN_VERSION} not found by pkg-config ({e}); install libfabric-dev, \
                 set PKG_CONFIG_PATH to the directory holding libfabric.pc, or LIBFABRIC_HOME to \
                 the installation prefix (with include/rdma/fabric.h and lib/libfabric.so)"
            ),
        },
    };

    let mut build = cc::Build::new();
    build.file("shim/shim.c").include("shim").warnings(true);
    for dir in &include_paths {
        build.include(dir);
    }
    build.compile("ddfi_shim");

    generate_bindings(&include_paths);
}

/// LIBFABRIC_HOME without a libfabric.pc: links its lib64/ or lib/ directly and
/// returns its include directory.
fn without_pkg_config(home: &std::path::Path) -> Option<PathBuf> {
    let include = home.join("include");
    if !include.join("rdma/fabric.h").is_file() {
        return None;
    }
    let libdir = ["lib64", "lib"]
        .iter()
        .map(|d| home.join(d))
        .find(|d| d.join("libfabric.so").exists())?;
    println!("cargo:rustc-link-search=native={}", libdir.display());
    println!("cargo:rustc-link-lib=dylib=fabric");
    Some(include)
}

#[cfg(feature = "bindgen")]
fn generate_bindings(include_paths: &[PathBuf]) {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let bindings = bindgen::Builder::default()
        .header("shim/shim.h")
        .clang_args(include_paths.iter().map(|p| format!("-I{}", p.display())))
        // Only symbols every libfabric since 1.17 (FABRIC_1.x) exports, plus the shim.
        .allowlist_function(
            "fi_getinfo|fi_freeinfo|fi_dupinfo|fi_fabric|fi_strerror|fi_version|fi_tostr|ddfi_.*",
        )
        .allowlist_type("fi_.*|fid_.*|fid")
        .allowlist_var("FI_.*")
        .derive_default(true)
        .prepend_enum_name(false)
        .layout_tests(false)
        .generate()
        .expect("bindgen could not process libfabric's headers");
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("writing bindings.rs");
}

#[cfg(not(feature = "bindgen"))]
fn generate_bindings(_include_paths: &[PathBuf]) {}
