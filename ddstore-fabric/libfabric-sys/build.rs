//! Finds libfabric (>= 1.17) with pkg-config, compiles the C shim that gives
//! libfabric's static inline API real symbols, and (feature `bindgen`)
//! regenerates the bindings against the headers found.

use std::path::PathBuf;

const MIN_VERSION: &str = "1.17";

fn main() {
    println!("cargo:rerun-if-changed=shim/shim.c");
    println!("cargo:rerun-if-changed=shim/shim.h");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");

    let lib = match pkg_config::Config::new()
        .atleast_version(MIN_VERSION)
        .probe("libfabric")
    {
        Ok(lib) => lib,
        Err(e) => panic!(
            "libfabric >= {MIN_VERSION} not found by pkg-config ({e}); install libfabric-dev \
             or set PKG_CONFIG_PATH to the directory holding libfabric.pc"
        ),
    };

    let mut build = cc::Build::new();
    build.file("shim/shim.c").include("shim").warnings(true);
    for dir in &lib.include_paths {
        build.include(dir);
    }
    build.compile("ddfi_shim");

    generate_bindings(&lib.include_paths);
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
