//! larder-bench: the bench harness behind `larder bench kernels|io|decode|serve|pull|lazy|cache|run`.
//!
//! Each bench measures against the physical limit of the same run (RAM and
//! compute roofs, the drive limit before and after, a loopback link's raw
//! rate) and returns a report the CLI prints or writes as JSON:
//!
//! - [`kernels`]: weight-format GEMV/GEMM kernels vs. RAM bandwidth and the
//!   compute roofs (and candle's matmul);
//! - [`store`]: expert-record reads through each I/O backend, and the expert
//!   index every bench reads; [`decode`]: decode speed streaming experts;
//! - [`serve`]: the real server over loopback HTTP with concurrent clients;
//! - [`pull`] and [`lazy`]: `pull` and lazy mode from a [`loopback`] file
//!   server (full speed, or throttled to a link's rate);
//! - [`cache`]: a route trace replayed against every cache policy and
//!   Belady's optimum; [`trace`]: recorded routes as trace files;
//! - [`run`]: a named scenario manifest: interleaved arms in fresh
//!   processes, oracle check, results.json, summary.md and SVG charts.
//!
//! It owns measuring, arms and their interleaving, reports and charts. It
//! must not know about command-line flags, terminals or how progress is drawn
//! (the caller's [`Observer`] shows it), nor print anything itself; and no
//! inference crate (tensor, router, model, store, spec, engine, serve) may
//! depend on it.

pub mod cache;
pub mod decode;
pub mod error;
pub mod kernels;
pub mod lazy;
pub mod loopback;
pub mod observe;
pub mod pull;
pub mod run;
pub mod serve;
pub mod store;
pub mod trace;

pub use error::{BenchError, BoxError, Result};
pub use observe::{Observer, Silent, Task, Unit};
