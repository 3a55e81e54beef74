//! # oxccl-python: the `oxccl` Python package's extension module (`oxccl._oxccl`)
//!
//! Glue only: every collective, the bootstrap and registration are oxccl-collectives'.
//! This crate reads Python arrays ([`buffer`]: numpy, DLPack, CUDA array interface) and
//! exposes one rank's communicator ([`comm`]); the package in `python/oxccl/` adds the
//! conveniences (current streams, torch stores, custom ops, the process group).
//!
//! Built by maturin (`python/pyproject.toml`) into one abi3 wheel (CPython >= 3.10); the
//! default build holds only the host backend, `--features cuda` adds CUDA.

pub mod allocator;
pub mod buffer;
pub mod comm;

use pyo3::prelude::*;

pyo3::create_exception!(
    oxccl,
    OxcclError,
    pyo3::exceptions::PyRuntimeError,
    "A failure of an oxccl call: the message names the call, the rank and the cause."
);

#[pymodule]
fn _oxccl(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("OxcclError", m.py().get_type::<OxcclError>())?;
    m.add_class::<comm::PyCommunicator>()?;
    m.add_function(wrap_pyfunction!(comm::unique_id, m)?)?;
    m.add_function(wrap_pyfunction!(comm::backends, m)?)?;
    m.add_function(wrap_pyfunction!(comm::dtypes, m)?)?;
    m.add_function(wrap_pyfunction!(comm::dtype_code, m)?)?;
    m.add(
        "UNIQUE_ID_BYTES",
        oxccl_collectives::channels::bootstrap::UNIQUE_ID_BYTES,
    )?;
    Ok(())
}
