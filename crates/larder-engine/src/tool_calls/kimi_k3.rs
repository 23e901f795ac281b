//! Kimi K3's tool calls, in its XTML tags after the `response` tag of an
//! assistant message:
//!
//! ```text
//! <|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>
//! <|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>
//! <|close|>call<|sep|><|close|>tools<|sep|>
//! ```
//!
//! (no line breaks), as the release's `encoding_k3.py` renders past calls
//! (`_render_assistant_segments`, transcribed in [`crate::kimi_k3_chat`]):
//! each argument an `argument` tag with its key and XTML type (`string`
//! values written raw, every other type as JSON), or the whole arguments as
//! one `json` tag of type `object`. Attribute values are unescaped (`&quot;`,
//! `&amp;`). The arguments are returned as JSON text (`json.dumps`'s
//! default separators). A section that does not read this way is content,
//! as written. [`K3Response`] reads the content around it: the `response`
//! tag, then this section, then the close of the message.

use serde_json::{Map, Value as Json};

use super::{held_back, OutputParser, ParsedOutput, ParsedToolCall};
use crate::kimi_k3_chat::{CLOSE, END_OF_MSG, OPEN, SEP};

/// Kimi K3's `response` tag around the content (opened by the output, or
/// by the prompt when thinking is off), then, when `calls`, its `tools`
/// tag ([`parse_section`]), then the close of the message;
/// text not in that form is content as written.
pub struct K3Response {
    pub opened: bool,
    /// Read tool calls after the response.
    pub calls: bool,
}

impl K3Response {
    fn read(&self, text: &str, finished: bool) -> ParsedOutput {
        let open = format!("{OPEN}response{SEP}");
        let close = format!("{CLOSE}response{SEP}");
        let body = if self.opened {
            text
        } else if let Some(after) = text.strip_prefix(open.as_str()) {
            after
        } else if !finished && open.starts_with(text) {
            return ParsedOutput::default();
        } else {
            return ParsedOutput::content(text);
        };
        if let Some((content, tail)) = body.split_once(close.as_str()) {
            if !finished {
                return ParsedOutput::content(content);
            }
            let message_end = format!("{CLOSE}message{SEP}");
            let rest = tail.strip_suffix(END_OF_MSG).unwrap_or(tail).trim_end();
            let rest = rest.strip_suffix(message_end.as_str()).unwrap_or(rest).trim_end();
            if rest.is_empty() {
                return ParsedOutput::content(content);
            }
            return match parse_section(rest).filter(|_| self.calls) {
                Some(tool_calls) => ParsedOutput {
                    content: content.to_string(),
                    tool_calls,
                    ..Default::default()
                },
                // Text after the closed response (not K3's form) is content too.
                None => ParsedOutput::content(&format!("{content}{tail}")),
            };
        }
        let keep = if finished { 0 } else { held_back(body, &[&close]) };
        ParsedOutput::content(&body[..body.len() - keep])
    }
}

impl OutputParser for K3Response {
    fn parse(&self, text: &str) -> ParsedOutput {
        self.read(text, true)
    }

    fn parse_partial(&self, text: &str) -> ParsedOutput {
        self.read(text, false)
    }
}

/// The calls of a whole `tools` section (`<|open|>tools<|sep|>` to its
/// close, whitespace between tags allowed); `None` when it does not parse.
pub fn parse_section(section: &str) -> Option<Vec<ParsedToolCall>> {
    let mut r = Reader(section.trim());
    r.open("tools")?;
    let mut calls = Vec::new();
    while !r.peek_close("tools") {
        calls.push(call(&mut r)?);
    }
    r.close("tools")?;
    (r.0.is_empty() && !calls.is_empty()).then_some(calls)
}

fn call(r: &mut Reader) -> Option<ParsedToolCall> {
    let attrs = r.open("call")?;
    let name = attr(&attrs, "tool")?;
    if name.is_empty() {
        return None;
    }
    let mut arguments = Map::new();
    let mut raw = None;
    while !r.peek_close("call") {
        if r.peek_open("json") {
            let attrs = r.open("json")?;
            let body = r.until_close("json")?;
            match (attr(&attrs, "type").as_deref(), serde_json::from_str::<Json>(body)) {
                (Some("object"), Ok(Json::Object(map))) if raw.is_none() && arguments.is_empty() => raw = Some(map),
                _ => return None,
            }
        } else {
            let attrs = r.open("argument")?;
            let key = attr(&attrs, "key")?;
            let value = r.until_close("argument")?;
            let value = match attr(&attrs, "type")?.as_str() {
                "string" => Json::String(value.to_string()),
                kind => typed(value, kind)?,
            };
            arguments.insert(key, value);
        }
    }
    r.close("call")?;
    let arguments = Json::Object(raw.unwrap_or(arguments));
    Some(ParsedToolCall {
        id: None,
        name,
        arguments: crate::chat_json::python_dumps(&arguments),
    })
}

/// A non-string argument: JSON of the declared type.
fn typed(value: &str, kind: &str) -> Option<Json> {
    let v: Json = serde_json::from_str(value).ok()?;
    let ok = match kind {
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        _ => false,
    };
    ok.then_some(v)
}

/// `key`'s value among the attributes, unescaped.
fn attr(attrs: &[(String, String)], key: &str) -> Option<String> {
    attrs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
}

/// Reads tags off the front of the text.
struct Reader<'a>(&'a str);

impl<'a> Reader<'a> {
    fn skip_space(&mut self) {
        self.0 = self.0.trim_start();
    }

    fn peek_open(&mut self, tag: &str) -> bool {
        self.skip_space();
        self.0.strip_prefix(OPEN).is_some_and(|rest| {
            rest.strip_prefix(tag)
                .is_some_and(|after| after.starts_with(' ') || after.starts_with(SEP))
        })
    }

    fn peek_close(&mut self, tag: &str) -> bool {
        self.skip_space();
        self.0.starts_with(&format!("{CLOSE}{tag}{SEP}"))
    }

    /// `<|open|>tag attrs<|sep|>`: the attributes.
    fn open(&mut self, tag: &str) -> Option<Vec<(String, String)>> {
        if !self.peek_open(tag) {
            return None;
        }
        let rest = &self.0[OPEN.len() + tag.len()..];
        let (head, after) = rest.split_once(SEP)?;
        self.0 = after;
        attributes(head)
    }

    fn close(&mut self, tag: &str) -> Option<()> {
        if !self.peek_close(tag) {
            return None;
        }
        self.0 = &self.0[CLOSE.len() + tag.len() + SEP.len()..];
        Some(())
    }

    /// The text up to `<|close|>tag<|sep|>` (which is consumed).
    fn until_close(&mut self, tag: &str) -> Option<&'a str> {
        let end = format!("{CLOSE}{tag}{SEP}");
        let (body, after) = self.0.split_once(&end)?;
        self.0 = after;
        Some(body)
    }
}

/// ` key="value"` pairs (values unescaped: `&quot;`, then `&amp;`).
fn attributes(mut head: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    while !head.is_empty() {
        let rest = head.strip_prefix(' ')?;
        let (key, rest) = rest.split_once("=\"")?;
        let (value, rest) = rest.split_once('"')?;
        out.push((key.to_string(), value.replace("&quot;", "\"").replace("&amp;", "&")));
        head = rest;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_read_back() {
        let s = "<|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|>\
                 <|open|>argument key=\"city\" type=\"string\"<|sep|>Pa\"ris<|close|>argument<|sep|>\
                 <|open|>argument key=\"days\" type=\"number\"<|sep|>3<|close|>argument<|sep|><|close|>call<|sep|>\
                 <|open|>call tool=\"a&amp;b\" index=\"2\"<|sep|><|open|>json type=\"object\"<|sep|>{\"x\": [1]}<|close|>json<|sep|>\
                 <|close|>call<|sep|><|close|>tools<|sep|>";
        let calls = parse_section(s).unwrap();
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city": "Pa\"ris", "days": 3}"#);
        assert_eq!((calls[1].name.as_str(), calls[1].arguments.as_str()), ("a&b", r#"{"x": [1]}"#));
    }

    #[test]
    fn malformed_sections_do_not_parse() {
        for bad in [
            "<|open|>tools<|sep|><|close|>tools<|sep|>",
            "<|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|><|close|>call<|sep|>",
            "<|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|><|open|>argument key=\"n\" type=\"number\"<|sep|>x<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>",
            "<|open|>tools<|sep|><|open|>call index=\"1\"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>",
            "<|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>trailing",
        ] {
            assert_eq!(parse_section(bad), None, "{bad}");
        }
    }
}
