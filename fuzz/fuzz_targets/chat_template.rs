//! Fuzzes chat-template rendering (`larder_engine::ChatTemplate`), three ways
//! picked by the first byte:
//! 0: fuzzed messages (NUL-separated role, content pairs) through the real
//!    template of `fixtures/qwen3_moe_tok`;
//! 1: a fuzzed `tokenizer_config.json` (template, special tokens) read by
//!    `ChatTemplate::from_dir`, rendering a fixed conversation;
//! 2: a fuzzed `chat_template.jinja` beside no tokenizer config.
//! Any input renders or is an error, never a panic.
#![no_main]

use std::sync::OnceLock;

use larder_engine::{ChatMessage, ChatTemplate};
use libfuzzer_sys::fuzz_target;

fn real_template() -> Option<&'static ChatTemplate> {
    static T: OnceLock<Option<ChatTemplate>> = OnceLock::new();
    T.get_or_init(|| {
        let dir = larder_fuzz::fixtures().join("qwen3_moe_tok");
        match ChatTemplate::from_dir(&dir) {
            Ok(Some(t)) => Some(t),
            other => panic!("the fixture template of {} does not load: {:?}", dir.display(), other.err()),
        }
    })
    .as_ref()
}

fn messages(data: &[u8]) -> Vec<ChatMessage> {
    let text = String::from_utf8_lossy(data);
    let fields: Vec<&str> = text.split('\0').collect();
    fields
        .chunks(2)
        .map(|p| ChatMessage::new(p[0], p.get(1).copied().unwrap_or("")))
        .collect()
}

fn fixed_conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "be brief"),
        ChatMessage::new("user", "hi"),
        ChatMessage::new("assistant", "<think>\nhm\n</think>\n\nhello"),
        ChatMessage::new("user", "again"),
    ]
}

fn render_from_dir(name: &str, bytes: &[u8]) {
    let dir = larder_fuzz::scratch_dir("chat_template");
    larder_fuzz::write(dir, name, bytes);
    if let Ok(Some(t)) = ChatTemplate::from_dir(dir) {
        let _ = t.render(&fixed_conversation(), true);
        let _ = t.render(&fixed_conversation()[..1], false);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    match mode % 3 {
        0 => {
            if let Some(t) = real_template() {
                let _ = t.render(&messages(rest), mode & 0x80 != 0);
            }
        }
        1 => render_from_dir("tokenizer_config.json", rest),
        _ => render_from_dir("chat_template.jinja", rest),
    }
});
