//! Markdown / reStructuredText: split into sections at headings, keeping the heading path.
//! ATX (`## Title`) and underlined (setext / RST) headings; nothing inside code fences.

use super::{Line, Section};

#[derive(Clone, Copy, PartialEq)]
pub enum Flavor {
    Markdown,
    Rst,
}

pub fn sections(text: &str, flavor: Flavor) -> Vec<Section> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut cur = Section::default();
    // RST levels are defined by the order in which underline characters first appear.
    let mut rst_levels: Vec<char> = Vec::new();
    let mut in_fence: Option<&str> = None;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        if flavor == Flavor::Markdown {
            if let Some(f) = in_fence {
                if trimmed.starts_with(f) {
                    in_fence = None;
                }
                push(&mut cur, i, line);
                i += 1;
                continue;
            }
            if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
                in_fence = Some(&trimmed[..3]);
                push(&mut cur, i, line);
                i += 1;
                continue;
            }
        }
        let heading = if flavor == Flavor::Markdown {
            atx_heading(line)
        } else {
            None
        }
        .or_else(|| {
            let next = lines.get(i + 1)?;
            let c = underline_char(next, line, flavor)?;
            let level = match flavor {
                Flavor::Markdown => {
                    if c == '=' {
                        1
                    } else {
                        2
                    }
                }
                Flavor::Rst => {
                    if !rst_levels.contains(&c) {
                        rst_levels.push(c);
                    }
                    rst_levels.iter().position(|&x| x == c).unwrap_or(0) + 1
                }
            };
            Some((level, line.trim().to_string()))
        });
        match heading {
            Some((level, title)) => {
                flush(&mut out, &mut cur);
                while stack.last().is_some_and(|(l, _)| *l >= level) {
                    stack.pop();
                }
                stack.push((level, title));
                cur.heading = stack.iter().map(|(_, t)| t.clone()).collect();
                push(&mut cur, i, line);
                let is_atx = flavor == Flavor::Markdown && atx_heading(line).is_some();
                if !is_atx {
                    push(&mut cur, i + 1, lines[i + 1]);
                    i += 1;
                }
            }
            None => push(&mut cur, i, line),
        }
        i += 1;
    }
    flush(&mut out, &mut cur);
    out
}

fn push(cur: &mut Section, idx: usize, text: &str) {
    cur.lines.push(Line {
        number: idx as u32 + 1,
        text: text.to_string(),
    });
}

fn flush(out: &mut Vec<Section>, cur: &mut Section) {
    let heading = cur.heading.clone();
    let done = std::mem::take(cur);
    cur.heading = heading;
    if done.lines.iter().any(|l| !l.text.trim().is_empty()) {
        out.push(done);
    }
}

fn atx_heading(line: &str) -> Option<(usize, String)> {
    let t = line.trim_start();
    if line.len() - t.len() > 3 {
        return None;
    }
    let level = t.chars().take_while(|&c| c == '#').count();
    if level == 0 || level > 6 {
        return None;
    }
    let rest = &t[level..];
    if !rest.is_empty() && !rest.starts_with(' ') && !rest.starts_with('\t') {
        return None;
    }
    let title = rest.trim().trim_end_matches('#').trim().to_string();
    if title.is_empty() {
        return None;
    }
    Some((level, title))
}

/// The underline character if `under` underlines the non-empty text line `title`.
fn underline_char(under: &str, title: &str, flavor: Flavor) -> Option<char> {
    let u = under.trim_end();
    let t = title.trim();
    if t.is_empty() || title.starts_with(' ') || title.starts_with('\t') {
        return None;
    }
    let c = u.chars().next()?;
    let allowed: &[char] = match flavor {
        Flavor::Markdown => &['=', '-'],
        Flavor::Rst => &[
            '=', '-', '~', '^', '"', '\'', '`', '#', '*', '+', '_', ':', '.',
        ],
    };
    if !allowed.contains(&c) || !u.chars().all(|x| x == c) {
        return None;
    }
    let min = match flavor {
        Flavor::Markdown => 1,
        Flavor::Rst => t.chars().count().max(3),
    };
    // A title that is itself a rule or a list item is not a heading.
    if u.chars().count() < min
        || t.chars().all(|x| x == c)
        || t.starts_with("- ")
        || t.starts_with("* ")
    {
        return None;
    }
    Some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heading_paths_and_lines() {
        let md = "intro line\n# Guide\ntext a\n## Install\nstep 1\n```\n# not a heading\n```\n## Use\nrun it\nSetext\n------\nunder setext\n# Other\nz\n";
        let s = sections(md, Flavor::Markdown);
        let paths: Vec<String> = s.iter().map(|s| s.heading.join(" > ")).collect();
        assert_eq!(
            paths,
            vec![
                "",
                "Guide",
                "Guide > Install",
                "Guide > Use",
                "Guide > Setext",
                "Other"
            ]
        );
        let install = &s[2];
        assert_eq!(install.lines[0].number, 4);
        assert!(install.lines.iter().any(|l| l.text == "# not a heading"));
        assert_eq!(s[4].lines.last().unwrap().text, "under setext");
    }

    #[test]
    fn rst_levels_by_first_appearance() {
        let rst = "Title\n=====\n\nbody\n\nSub\n---\nmore\n\nSub2\n----\nx\n";
        let s = sections(rst, Flavor::Rst);
        let paths: Vec<String> = s.iter().map(|s| s.heading.join(" > ")).collect();
        assert_eq!(paths, vec!["Title", "Title > Sub", "Title > Sub2"]);
    }
}
