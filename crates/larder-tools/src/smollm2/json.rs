//! A small ordered JSON value and a writer that prints it byte for byte as
//! Python's `json.dump(..., ensure_ascii=False)` does (key order kept, `repr`
//! floats such as `1e-05`, `indent=2` or Python's default separators), so
//! the converted checkpoint's JSON files equal those of the reference script.
//! (model.safetensors' header is larder-tensor's `safetensors_write`.)

use std::fmt::Write;

/// A JSON value whose objects keep their insertion order.
#[derive(Debug, Clone, PartialEq)]
pub enum J {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl J {
    /// An object from `(key, value)` pairs, in order.
    pub fn obj<K: Into<String>>(pairs: Vec<(K, J)>) -> J {
        J::Obj(pairs.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    /// A string value.
    pub fn s(s: impl Into<String>) -> J {
        J::Str(s.into())
    }

    /// An optional integer: `null` when absent.
    pub fn opt_int(v: Option<i64>) -> J {
        v.map_or(J::Null, J::Int)
    }
}

/// How to print: Python's `json.dump` options that the converter uses.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    /// `indent=2` (None: everything on one line).
    pub indent: Option<usize>,
}

impl Style {
    /// `json.dump(obj, f, indent=2, ensure_ascii=False)`.
    pub const PRETTY: Style = Style { indent: Some(2) };
    /// `json.dump(obj, f, ensure_ascii=False)`.
    pub const LINE: Style = Style { indent: None };
}

/// Prints `value` as Python would; a NaN or infinite float is an error (the converter never writes one).
pub fn to_string(value: &J, style: Style) -> Result<String, String> {
    let mut out = String::new();
    write_value(&mut out, value, style, 0)?;
    Ok(out)
}

fn write_value(out: &mut String, v: &J, style: Style, depth: usize) -> Result<(), String> {
    match v {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Int(i) => {
            let _ = write!(out, "{i}");
        }
        J::Float(f) => out.push_str(&py_float_repr(*f)?),
        J::Str(s) => write_str(out, s),
        J::Arr(items) => {
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                separator(out, style, depth + 1, i == 0);
                write_value(out, item, style, depth + 1)?;
            }
            close(out, style, depth);
            out.push(']');
        }
        J::Obj(pairs) => {
            if pairs.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (k, item)) in pairs.iter().enumerate() {
                separator(out, style, depth + 1, i == 0);
                write_str(out, k);
                out.push_str(": ");
                write_value(out, item, style, depth + 1)?;
            }
            close(out, style, depth);
            out.push('}');
        }
    }
    Ok(())
}

/// What goes before an array item or object key.
fn separator(out: &mut String, style: Style, depth: usize, first: bool) {
    match style.indent {
        Some(n) => {
            if !first {
                out.push(',');
            }
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * depth));
        }
        None if first => {}
        None => out.push_str(", "),
    }
}

/// What goes before a closing bracket.
fn close(out: &mut String, style: Style, depth: usize) {
    if let Some(n) = style.indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', n * depth));
    }
}

/// A JSON string literal with Python's escapes (`\n`, `\u001f`); non-ASCII
/// is written as is (`ensure_ascii=False`).
fn write_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest digits that round-trip, positional
/// for exponents -4..16 (`100000.0`, `0.02`), scientific otherwise (`1e-05`).
pub fn py_float_repr(x: f64) -> Result<String, String> {
    if !x.is_finite() {
        return Err(format!("{x} cannot be written as JSON"));
    }
    if x == 0.0 {
        return Ok(if x.is_sign_negative() { "-0.0" } else { "0.0" }.to_string());
    }
    // Rust's `{:e}` prints the shortest round-trip digits: "1e-5", "1.25e2".
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').ok_or_else(|| format!("unexpected float format {sci}"))?;
    let exp: i32 = exp.parse().map_err(|_| format!("unexpected float format {sci}"))?;
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if x < 0.0 { "-" } else { "" };
    let body = if (-4..16).contains(&exp) {
        if exp >= 0 {
            let int_len = exp as usize + 1;
            if digits.len() <= int_len {
                format!("{digits}{}.0", "0".repeat(int_len - digits.len()))
            } else {
                format!("{}.{}", &digits[..int_len], &digits[int_len..])
            }
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        }
    } else {
        let rest = if digits.len() > 1 {
            format!(".{}", &digits[1..])
        } else {
            String::new()
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{}{rest}e{esign}{:02}", &digits[..1], exp.abs())
    };
    Ok(format!("{sign}{body}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_as_python_repr() {
        let cases = [
            (1e-5, "1e-05"),
            (100000.0, "100000.0"),
            (0.02, "0.02"),
            (0.0, "0.0"),
            (1.5, "1.5"),
            (123.25, "123.25"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1.25e-7, "1.25e-07"),
            (1e15, "1000000000000000.0"),
            (-2.5, "-2.5"),
        ];
        for (x, want) in cases {
            assert_eq!(py_float_repr(x).unwrap(), want, "{x}");
        }
    }

    #[test]
    fn layout_matches_python() {
        let v = J::obj(vec![
            ("a", J::Arr(vec![J::s("x\u{1}é"), J::Int(3)])),
            ("b", J::Obj(vec![])),
            ("c", J::Arr(vec![])),
            ("d", J::Null),
        ]);
        assert_eq!(
            to_string(&v, Style::PRETTY).unwrap(),
            "{\n  \"a\": [\n    \"x\\u0001é\",\n    3\n  ],\n  \"b\": {},\n  \"c\": [],\n  \"d\": null\n}"
        );
        assert_eq!(
            to_string(&v, Style::LINE).unwrap(),
            "{\"a\": [\"x\\u0001é\", 3], \"b\": {}, \"c\": [], \"d\": null}"
        );
    }
}
