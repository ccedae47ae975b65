//! kiln-train's tests, in one binary: the engine (resume, checkpoints, early stopping), data
//! parallel and accumulated steps, reads from the device, the optimizers against PyTorch's
//! update rule, and the run's pages as a browser shows them. One binary, because each test file
//! compiles the engine for flex: as four binaries they took seven of the test build's CPU
//! minutes.

mod common;
mod engine;
mod optimizer_vs_pytorch;
mod parallel;
mod reads;
mod report;
