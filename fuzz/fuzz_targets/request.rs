//! Fuzzes the server's request JSON: `/v1/chat/completions` and
//! `/v1/completions` bodies through `larder_serve::api::parse_request`
//! (first byte picks the endpoint). Any body is a request or a 4xx error
//! with an OpenAI-shaped JSON body, never a panic.
#![no_main]

use larder_serve::api::{parse_request, Endpoint};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else { return };
    let endpoint = if mode % 2 == 0 { Endpoint::Chat } else { Endpoint::Completion };
    if let Err(e) = parse_request(endpoint, body, "larder") {
        assert!((400..500).contains(&e.status), "a bad body is a client error, got {}", e.status);
        let text = e.body().to_string();
        assert!(
            serde_json::from_str::<serde_json::Value>(&text).is_ok(),
            "error body is not JSON: {text}"
        );
    }
});
