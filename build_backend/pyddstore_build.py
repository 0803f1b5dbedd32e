"""The PEP 517 backend of `pip install .`: maturin's, after mapping the site's MPI_HOME to the
variable the Rust build reads.

The MPI probe of the `mpi` crate tries MPI_PKG_CONFIG, CRAY_MPICH_DIR, then MPICC (else the
`mpicc` on PATH); with MPI_HOME set and MPICC unset, MPICC becomes $MPI_HOME/bin/mpicc. libfabric's
LIBFABRIC_HOME and PKG_CONFIG_PATH are read by libfabric-sys's build script itself."""

from __future__ import annotations

import os


def _site_environment(environ=os.environ) -> None:
    home = environ.get("MPI_HOME", "").strip()
    if home and not environ.get("MPICC"):
        wrapper = os.path.join(home, "bin", "mpicc")
        if os.path.exists(wrapper):
            environ["MPICC"] = wrapper


_site_environment()
# maturin warns "build-backend ... is not set to maturin, pip will not use maturin" (once per
# hook) because this module wraps it; pip does use maturin through it, so the warning is false.
os.environ.setdefault("MATURIN_NO_MISSING_BUILD_BACKEND_WARNING", "1")

from maturin import (  # noqa: E402 - after the environment is set
    build_editable,
    build_sdist,
    build_wheel,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]
