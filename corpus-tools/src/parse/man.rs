//! Man pages: roff source (`.SH`/`.SS` become headings, font escapes are stripped) and
//! already-rendered man text (all-caps section names at column 0 become headings).

use super::{Line, Section};

pub fn roff_sections(text: &str) -> Vec<Section> {
    let mut out = Vec::new();
    let mut title: Option<String> = None;
    let mut cur = Section::default();
    for (i, raw) in text.lines().enumerate() {
        let number = i as u32 + 1;
        if raw.starts_with(".\\\"") || raw.starts_with("'\\\"") || raw.starts_with("\\\"") {
            continue;
        }
        if let Some(rest) = raw.strip_prefix('.').or_else(|| raw.strip_prefix('\'')) {
            let (req, args) = rest
                .trim_start()
                .split_once(char::is_whitespace)
                .unwrap_or((rest.trim(), ""));
            let args = unquote(args.trim());
            match req {
                "TH" => {
                    let mut it = args.split_whitespace();
                    let name = it.next().unwrap_or("").to_string();
                    let sec = it.next().unwrap_or("");
                    title = Some(if sec.is_empty() {
                        name
                    } else {
                        format!("{name}({sec})")
                    });
                }
                "SH" | "SS" | "Sh" | "Ss" => {
                    if cur.lines.iter().any(|l| !l.text.trim().is_empty()) {
                        out.push(std::mem::take(&mut cur));
                    } else {
                        cur = Section::default();
                    }
                    let name = clean(&args);
                    let mut heading: Vec<String> = title.iter().cloned().collect();
                    if req.eq_ignore_ascii_case("SS") {
                        if let Some(parent) = out
                            .last()
                            .and_then(|s: &Section| s.heading.get(heading.len()).cloned())
                        {
                            heading.push(parent);
                        }
                    }
                    heading.push(name.clone());
                    cur.heading = heading;
                    cur.lines.push(Line { number, text: name });
                }
                "B" | "I" | "SM" | "SB" | "IP" | "TP" | "TQ" | "Nm" | "Fl" | "Ar" | "Nd" | "Pa"
                | "Xr"
                    if !args.is_empty() =>
                {
                    cur.lines.push(Line {
                        number,
                        text: clean(&args),
                    });
                }
                "BR" | "RB" | "IR" | "RI" | "BI" | "IB" => {
                    let joined: String = args
                        .split_whitespace()
                        .map(unquote)
                        .collect::<Vec<_>>()
                        .join("");
                    cur.lines.push(Line {
                        number,
                        text: clean(&joined),
                    });
                }
                "PP" | "LP" | "P" | "sp" | "Pp" => cur.lines.push(Line {
                    number,
                    text: String::new(),
                }),
                _ => {}
            }
            continue;
        }
        cur.lines.push(Line {
            number,
            text: clean(raw),
        });
    }
    if cur.lines.iter().any(|l| !l.text.trim().is_empty()) {
        out.push(cur);
    }
    out
}

fn unquote(s: &str) -> String {
    s.trim().trim_matches('"').to_string()
}

/// Strip roff escapes: fonts (`\fB`), special characters (`\(em`), `\-`, `\&`...
fn clean(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('f') => match chars.next() {
                Some('(') => {
                    chars.next();
                    chars.next();
                }
                Some('[') => {
                    for x in chars.by_ref() {
                        if x == ']' {
                            break;
                        }
                    }
                }
                _ => {}
            },
            Some('(') => {
                let a = chars.next().unwrap_or(' ');
                let b = chars.next().unwrap_or(' ');
                out.push_str(match (a, b) {
                    ('e', 'm') | ('e', 'n') => "-",
                    ('l', 'q') | ('r', 'q') => "\"",
                    ('b', 'u') => "*",
                    ('c', 'o') => "(c)",
                    _ => "",
                });
            }
            Some('*') => {
                if chars.peek() == Some(&'(') {
                    chars.next();
                    chars.next();
                    chars.next();
                } else {
                    chars.next();
                }
            }
            Some('-') => out.push('-'),
            Some('e') | Some('\\') => out.push('\\'),
            Some(' ') | Some('~') => out.push(' '),
            Some('&') | Some('c') | Some('|') | Some('^') | Some('%') => {}
            Some(other) => out.push(other),
            None => {}
        }
    }
    out
}

/// `man foo | col -b` output: NAME ... DESCRIPTION at column 0.
pub fn looks_like_rendered_man(text: &str) -> bool {
    let head: Vec<&str> = text.lines().take(40).collect();
    head.iter().any(|l| l.trim_end() == "NAME")
        && text.lines().any(|l| l.trim_end() == "DESCRIPTION")
}

pub fn rendered_sections(text: &str) -> Vec<Section> {
    let mut out = Vec::new();
    let mut cur = Section::default();
    for (i, l) in text.lines().enumerate() {
        let t = l.trim_end();
        let is_heading = !t.is_empty()
            && !t.starts_with(' ')
            && t.len() <= 40
            && t.chars().any(|c| c.is_alphabetic())
            && t.chars()
                .all(|c| c.is_uppercase() || c == ' ' || c == '-' || c == '_');
        if is_heading {
            if cur.lines.iter().any(|l| !l.text.trim().is_empty()) {
                out.push(std::mem::take(&mut cur));
            } else {
                cur = Section::default();
            }
            cur.heading = vec![t.to_string()];
        }
        cur.lines.push(Line {
            number: i as u32 + 1,
            text: l.to_string(),
        });
    }
    if cur.lines.iter().any(|l| !l.text.trim().is_empty()) {
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roff_headings_and_escapes() {
        let src = ".\\\" comment\n.TH FROB 1\n.SH NAME\nfrob \\- twiddle \\fBbits\\fR\n.SH OPTIONS\n.TP\n.BR \\-v \" , \" \\-\\-verbose\nBe loud.\n";
        let s = roff_sections(src);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].heading, vec!["FROB(1)", "NAME"]);
        assert!(s[0].lines.iter().any(|l| l.text == "frob - twiddle bits"));
        assert_eq!(s[1].heading, vec!["FROB(1)", "OPTIONS"]);
        assert!(s[1].lines.iter().any(|l| l.text.contains("--verbose")));
        assert_eq!(s[1].lines.last().unwrap().number, 8);
    }
}
