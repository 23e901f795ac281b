//! What larder-store's integration tests share: the fault-injecting test
//! hub (larder-testkit's) and client options for it.
#![allow(dead_code)]

use std::time::Duration;

pub use larder_testkit::hub::*;

/// Client options for tests: 4 attempts with millisecond backoff, a read
/// timeout of `read_timeout_ms` (stall tests wait longer than it).
pub fn client_options(read_timeout_ms: u64) -> larder_store::remote::RemoteOptions {
    use larder_store::remote::{RemoteOptions, RetryPolicy};
    RemoteOptions {
        retry: RetryPolicy {
            attempts: 4,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(5),
        },
        connect_timeout: Duration::from_secs(2),
        read_timeout: Duration::from_millis(read_timeout_ms),
        parallel: 4,
        deadline: None,
    }
}
