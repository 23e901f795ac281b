//! Chat messages, how a checkpoint formats them ([`ChatFormat`]: a template,
//! or Kimi K3's encoder in [`crate::kimi_k3_chat`]), and chat templates from
//! `tokenizer_config.json`, rendered with minijinja the way transformers
//! renders them: `trim_blocks` and `lstrip_blocks` on,
//! Python string methods available (`.strip()`, `.startswith()`, ...),
//! `raise_exception`, `strftime_now`, and the special tokens (`bos_token`,
//! `eos_token`, ...) in the context next to `messages` and
//! `add_generation_prompt`.
//!
//! A template is code from the model folder: rendering is bounded (at most
//! [`TEMPLATE_FUEL`] template instructions and [`MAX_RENDERED_BYTES`] of
//! output), so a looping or exploding template is an error, not a hang or an
//! out-of-memory abort (found by `fuzz/`'s `chat_template` target).

use std::path::Path;

use minijinja::{Environment, Error, ErrorKind, Value};
use serde_json::Value as Json;

pub use crate::chat_message::{ChatMessage, FunctionCall, ToolCall};
use crate::error::EngineError;

/// What a render passes a template besides the messages: transformers'
/// `apply_chat_template(messages, tools=tools, add_generation_prompt=...,
/// **kwargs)`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RenderOptions {
    /// Open the assistant's turn at the end.
    pub add_generation_prompt: bool,
    /// OpenAI tool declarations (`{"type": "function", "function": {...}}`),
    /// passed as given; `None` is the template's `tools = None`.
    pub tools: Option<Vec<Json>>,
    /// Extra template variables (`chat_template_kwargs`, e.g.
    /// `enable_thinking`, `reasoning_effort`).
    pub kwargs: serde_json::Map<String, Json>,
}

impl RenderOptions {
    /// No tools, no kwargs, the generation prompt added.
    pub fn generation() -> Self {
        RenderOptions {
            add_generation_prompt: true,
            ..Default::default()
        }
    }
}

/// Names a render sets itself; a kwarg of one of these names is refused
/// (Python refuses a keyword given twice).
const RESERVED_KWARGS: &[&str] = &["messages", "tools", "documents", "add_generation_prompt"];

/// How a checkpoint turns a chat into prompt ids.
pub(crate) enum ChatFormat {
    /// A jinja chat template: rendered to text, then tokenized whole.
    Template(Box<ChatTemplate>),
    /// Kimi K3's segment encoder ([`crate::kimi_k3_chat`]), with
    /// `apply_chat_template`'s defaults.
    KimiK3,
}

impl ChatFormat {
    /// The chat format of checkpoint folder `dir`: Kimi K3's encoder when
    /// the folder is in K3's form (`config.json`'s `model_type` is
    /// `kimi_k3`, or K3's control tokens without a template:
    /// [`crate::tokenizer::kimi_k3_form`]; the release's own encoder wins
    /// over a template added beside it), else its chat template; `Ok(None)`
    /// when it has neither.
    pub(crate) fn from_dir(dir: &Path) -> Result<Option<Self>, EngineError> {
        if crate::tokenizer::kimi_k3_form(dir) {
            return Ok(Some(ChatFormat::KimiK3));
        }
        Ok(ChatTemplate::from_dir(dir)?.map(|t| ChatFormat::Template(Box::new(t))))
    }
}

/// A compiled chat template plus the special tokens it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// `bos_token`, `eos_token`, ... as strings.
    special_tokens: serde_json::Map<String, Json>,
    /// The template concatenates a call's `arguments` as text
    /// (DeepSeek-V3's `+ tool['function']['arguments'] +`): they are passed
    /// as the JSON string; else as the parsed mapping, the form
    /// transformers documents and `arguments|tojson` needs (gpt-oss).
    arguments_as_text: bool,
    /// The tool-call family the template's text names (its preamble or its
    /// rendering of past calls).
    tool_family: Option<crate::tool_calls::ToolFamily>,
    /// The template writes `<think>` (a thinking model's).
    thinks: bool,
}

/// Template instructions one render may run: far above what real templates
/// need for any conversation a 1 MiB request body can hold (a few hundred
/// per message), and under a second of work.
pub(crate) const TEMPLATE_FUEL: u64 = 10_000_000;

/// The longest prompt a template may render (64 MiB).
pub(crate) const MAX_RENDERED_BYTES: usize = 64 << 20;

const SPECIAL_TOKEN_KEYS: &[&str] = &[
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "sep_token",
    "cls_token",
    "mask_token",
];

impl ChatTemplate {
    /// Reads the template of `tokenizer_config.json` (or `chat_template.jinja`
    /// beside it, as newer exports ship). `Ok(None)` when there is none.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>, EngineError> {
        let path = dir.join("tokenizer_config.json");
        let config: Json = if path.exists() {
            let text = std::fs::read_to_string(&path).map_err(|source| EngineError::Io {
                path: path.clone(),
                source,
            })?;
            serde_json::from_str(&text).map_err(|e| EngineError::File {
                path: path.clone(),
                message: format!("not valid JSON: {e}"),
            })?
        } else {
            Json::Null
        };
        let jinja = dir.join("chat_template.jinja");
        let source = match config.get("chat_template") {
            Some(Json::String(s)) => Some(s.clone()),
            // A list of named templates: take "default".
            Some(Json::Array(items)) => items
                .iter()
                .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
                .and_then(|t| t.get("template"))
                .and_then(Json::as_str)
                .map(str::to_string),
            _ if jinja.exists() => Some(std::fs::read_to_string(&jinja).map_err(|source| EngineError::Io {
                path: jinja.clone(),
                source,
            })?),
            _ => None,
        };
        let Some(source) = source else { return Ok(None) };
        let from = if config.get("chat_template").is_some() { path } else { jinja };
        let mut special_tokens = serde_json::Map::new();
        for key in SPECIAL_TOKEN_KEYS {
            if let Some(tok) = config.get(*key).and_then(token_text) {
                special_tokens.insert((*key).to_string(), Json::String(tok));
            }
        }
        match Self::new(source, special_tokens) {
            Ok(t) => Ok(Some(t)),
            Err(EngineError::Template(message)) => Err(EngineError::File {
                path: from,
                message: format!("chat template: {message}"),
            }),
            Err(e) => Err(e),
        }
    }

    /// Compiles `source` with the given special tokens.
    pub fn new(source: String, special_tokens: serde_json::Map<String, Json>) -> Result<Self, EngineError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(TEMPLATE_FUEL));
        // Errors say what and where (kind, line), without minijinja's source
        // dump, whose span arithmetic overflows on some render errors (a
        // panic in builds with debug assertions, found by fuzzing).
        env.set_debug(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        minijinja_contrib::add_to_environment(&mut env);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", crate::chat_json::tojson);
        let arguments_as_text = crate::chat_json::concatenates_arguments(&source);
        let tool_family = crate::tool_calls::ToolFamily::for_checkpoint(None, Some(&source));
        let thinks = source.contains(crate::reasoning::THINK_OPEN);
        env.add_template_owned("chat", source)
            .map_err(|e| EngineError::Template(format!("cannot compile: {e}")))?;
        Ok(ChatTemplate {
            env,
            special_tokens,
            arguments_as_text,
            tool_family,
            thinks,
        })
    }

    /// The same template with `strftime_now` reading a fixed clock
    /// (`unix_secs`, UTC) instead of the system's: renders become
    /// reproducible (tests compare against references made on another day).
    pub fn with_fixed_time(mut self, unix_secs: i64) -> Self {
        self.env
            .add_function("strftime_now", move |format: String| format_unix_time(unix_secs, &format));
        self
    }

    /// The reader of what a model with this template writes after `prompt`
    /// (rendered by this template): `<think>` reasoning when the template
    /// writes it (the output starts in it when `prompt` left it open), then
    /// the tool-call family the template names, if any.
    pub fn output_parser(&self, prompt: &str) -> Box<dyn crate::tool_calls::OutputParser> {
        self.reader(prompt, true)
    }

    /// [`ChatTemplate::output_parser`], tool calls read only when `tools`
    /// (else the content is taken as written).
    pub fn reader(&self, prompt: &str, tools: bool) -> Box<dyn crate::tool_calls::OutputParser> {
        use crate::reasoning::{output_parser, prompt_opens, ReasoningFormat, THINK_CLOSE, THINK_OPEN};
        let reasoning = match self.thinks {
            true => ReasoningFormat::Think {
                starts_open: prompt_opens(prompt, THINK_OPEN, THINK_CLOSE),
            },
            false => ReasoningFormat::None,
        };
        output_parser(self.tool_family.filter(|_| tools), reasoning)
    }

    /// Whether the template writes `<think>` (a thinking model's).
    pub fn thinks(&self) -> bool {
        self.thinks
    }

    /// The tool-call family the template names, if any.
    pub fn tool_family(&self) -> Option<crate::tool_calls::ToolFamily> {
        self.tool_family
    }

    /// Renders `messages`; `add_generation_prompt` opens the assistant turn.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, EngineError> {
        self.render_with(
            messages,
            &RenderOptions {
                add_generation_prompt,
                ..Default::default()
            },
        )
    }

    /// Renders `messages` with tools and template kwargs, the context
    /// transformers builds: the special tokens, the kwargs, `messages`,
    /// `tools` (`none` when absent), `documents` (`none`) and
    /// `add_generation_prompt`.
    pub fn render_with(&self, messages: &[ChatMessage], options: &RenderOptions) -> Result<String, EngineError> {
        if messages.is_empty() {
            return Err(EngineError::Invalid {
                field: "messages",
                message: "at least one message is needed".into(),
            });
        }
        crate::chat_json::check_tool_results(messages)?;
        let mut ctx = self.special_tokens.clone();
        for (key, value) in &options.kwargs {
            if RESERVED_KWARGS.contains(&key.as_str()) {
                return Err(EngineError::Invalid {
                    field: "chat_template_kwargs",
                    message: format!("{key:?} is set by the request itself, not a template kwarg"),
                });
            }
            ctx.insert(key.clone(), value.clone());
        }
        let listed: Vec<Json> = messages
            .iter()
            .map(|m| crate::chat_json::message_context(m, self.arguments_as_text))
            .collect();
        ctx.insert("messages".into(), Json::Array(listed));
        ctx.insert("tools".into(), options.tools.clone().map_or(Json::Null, Json::Array));
        ctx.insert("documents".into(), Json::Null);
        ctx.insert("add_generation_prompt".into(), Json::Bool(options.add_generation_prompt));
        let tmpl = self.env.get_template("chat").map_err(|e| EngineError::Template(e.to_string()))?;
        let mut out = CappedWriter(Vec::new());
        match tmpl.render_captured_to(Value::from_serialize(&ctx), &mut out) {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::OutOfFuel => {
                return Err(EngineError::Template(format!(
                    "cannot render: the chat template ran more than {TEMPLATE_FUEL} instructions (a loop that does not end?)"
                )))
            }
            Err(e) if e.kind() == ErrorKind::WriteFailure && out.0.len() >= MAX_RENDERED_BYTES => {
                return Err(EngineError::Template(format!(
                    "cannot render: the chat template produced more than {MAX_RENDERED_BYTES} bytes"
                )))
            }
            Err(e) => return Err(EngineError::Template(format!("cannot render: {e:#}"))),
        }
        String::from_utf8(out.0).map_err(|e| EngineError::Template(format!("cannot render: output is not UTF-8: {e}")))
    }
}

/// Collects rendered output, failing past [`MAX_RENDERED_BYTES`].
struct CappedWriter(Vec<u8>);

impl std::io::Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_RENDERED_BYTES {
            self.0.resize(MAX_RENDERED_BYTES, 0);
            return Err(std::io::Error::other("rendered prompt too large"));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A special token entry is a string or an `AddedToken` object with `content`.
fn token_text(v: &Json) -> Option<String> {
    match v {
        Json::String(s) => Some(s.clone()),
        Json::Object(o) => o.get("content").and_then(Json::as_str).map(str::to_string),
        _ => None,
    }
}

/// `strftime_now(format)`: the current UTC time in a strftime format (the
/// subset chat templates use: %d %m %Y %y %b %B %H %M %S %A %a %%).
/// transformers formats the host's local time; the two agree on a host in UTC.
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    format_unix_time(secs, &format)
}

fn format_unix_time(secs: i64, format: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = ["Thursday", "Friday", "Saturday", "Sunday", "Monday", "Tuesday", "Wednesday"];
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = DAYS[days.rem_euclid(7) as usize];
    let mname = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('b') => out.push_str(&mname[..3]),
            Some('B') => out.push_str(mname),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(&weekday[..3]),
            Some('H') => out.push_str(&format!("{:02}", tod / 3600)),
            Some('M') => out.push_str(&format!("{:02}", tod % 3600 / 60)),
            Some('S') => out.push_str(&format!("{:02}", tod % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_dates() {
        // 2024-07-26 13:25:09 UTC was a Friday.
        assert_eq!(
            format_unix_time(1_722_000_309, "%d %b %Y %H:%M:%S %A"),
            "26 Jul 2024 13:25:09 Friday"
        );
    }

    #[test]
    fn renders_simple_template_with_tokens() {
        let mut special = serde_json::Map::new();
        special.insert("bos_token".into(), Json::String("<s>".into()));
        let t = ChatTemplate::new(
            "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content.strip() }}\n{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}".into(),
            special,
        )
        .unwrap();
        let out = t.render(&[ChatMessage::new("user", " hi ")], true).unwrap();
        assert_eq!(out, "<s>[user]hi\n[assistant]");
    }

    #[test]
    fn looping_or_exploding_templates_are_errors() {
        let msgs = [ChatMessage::new("user", "hi")];
        let looping = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(looping.into(), Default::default()).unwrap();
        let e = t.render(&msgs, false).unwrap_err().to_string();
        assert!(e.contains("instructions"), "{e}");
        let exploding = "{% for i in range(100) %}{{ 'x' * 10000000 }}{% endfor %}";
        let t = ChatTemplate::new(exploding.into(), Default::default()).unwrap();
        let e = t.render(&msgs, false).unwrap_err().to_string();
        assert!(e.contains("bytes"), "{e}");
    }

    #[test]
    fn render_errors_with_odd_spans_are_errors() {
        // Found by fuzz/ (chat_template): formatting this render error
        // overflowed in minijinja's debug source dump.
        let src = "messa{% for  in range(1,thi0) %}{% for in range(1000040) %}x{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(src.into(), Default::default()).unwrap();
        let e = t.render(&[ChatMessage::new("user", "hi")], false).unwrap_err().to_string();
        assert!(e.contains("cannot render"), "{e}");
    }

    #[test]
    fn fixed_time_is_what_strftime_now_reads() {
        let t = ChatTemplate::new("{{ strftime_now('%Y-%m-%d %H:%M') }}".into(), Default::default())
            .unwrap()
            .with_fixed_time(1_722_000_309);
        assert_eq!(t.render(&[ChatMessage::new("user", "x")], false).unwrap(), "2024-07-26 13:25");
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}".into(), Default::default()).unwrap();
        let e = t.render(&[ChatMessage::new("system", "x")], false).unwrap_err();
        assert!(e.to_string().contains("no system role"), "{e}");
    }
}
