//! Property-based fuzzing of every parser through `parse_bytes`: random bytes, and valid
//! documents truncated, bit-flipped or with hostile sequences inserted, must give `Ok` or
//! a clean `Err`: never a panic, never longer than the per-file timeout of production
//! (`ParseLimits::default().timeout`), never more memory than [`alloc_budget`] on the
//! parsing thread, and never more extracted text than the input can explain.
//!
//! DOCX, ODT and EPUB are exercised only through `parse_bytes`, their public entry point
//! (their internals have their own tests in `documents.rs`).
//!
//! Case counts: [`CI_CASES`] per property (a few seconds in release); a long campaign sets
//! `PROPTEST_CASES` (docs/fuzzing.md).

use corpus_tools::parse::parse_bytes;
use corpus_tools::test_support::{docx_bytes, epub_bytes, odt_bytes, write_pdf, Block};
use corpus_tools::{DocKind, ParseLimits, ParsedDoc};
use proptest::prelude::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::OnceLock;
use std::time::Duration;

const CI_CASES: u32 = 128;

fn config() -> ProptestConfig {
    let mut c = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = CI_CASES;
    }
    c
}

/// Counts the bytes live on each thread and the peak since [`reset_peak`], so a case can
/// check the memory its parse took (allocations freed on another thread are not
/// subtracted: the peak can only be overstated).
struct Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarding the caller's valid layout to the system allocator.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grow(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with this layout (see `alloc`).
        unsafe { System.dealloc(ptr, layout) };
        shrink(layout.size());
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `alloc` and `dealloc`; `ptr` came from `System` with `layout`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            shrink(layout.size());
            grow(new_size);
        }
        p
    }
}

fn grow(n: usize) {
    // `try_with`: the thread-locals may already be gone while a thread exits.
    let _ = LIVE.try_with(|l| {
        let v = l.get().saturating_add(n);
        l.set(v);
        let _ = PEAK.try_with(|p| p.set(p.get().max(v)));
    });
}

fn shrink(n: usize) {
    let _ = LIVE.try_with(|l| l.set(l.get().saturating_sub(n)));
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Memory a parse may take on its thread: generous for what the formats need (html2text
/// lays out a DOM, lopdf keeps every object), far below what a decompression bomb or a
/// runaway loop takes.
fn alloc_budget(input: usize) -> usize {
    (96 << 20) + 512 * input
}

/// Extracted text a parse may produce: the containers and PDF may expand their input
/// (compression), but never past the limits the crate enforces.
const TEXT_BUDGET: usize = 64 << 20;

type ParseFn = fn(DocKind, &[u8]) -> Result<ParsedDoc, String>;

/// Parses `bytes` as `kind` on a thread like the one `parse_isolated` uses (16 MiB stack)
/// and returns what went wrong, if anything.
fn check(kind: DocKind, bytes: Vec<u8>) -> Result<(), String> {
    check_with(parse_bytes, ParseLimits::default().timeout, kind, bytes)
}

fn check_with(
    parse: ParseFn,
    timeout: Duration,
    kind: DocKind,
    bytes: Vec<u8>,
) -> Result<(), String> {
    let n = bytes.len();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("fuzz-parse".into())
        .stack_size(16 << 20)
        .spawn(move || {
            PEAK.with(|p| p.set(LIVE.with(Cell::get)));
            let start = LIVE.with(Cell::get);
            let r = std::panic::catch_unwind(|| {
                parse(kind, &bytes).map(|d| {
                    d.sections
                        .iter()
                        .flat_map(|s| &s.lines)
                        .map(|l| l.text.len() + 1)
                        .sum::<usize>()
                })
            });
            let peak = PEAK.with(Cell::get).saturating_sub(start);
            let _ = tx.send((r.is_ok(), r.ok().and_then(|r| r.ok()), peak));
        })
        .map_err(|e| e.to_string())?;
    match rx.recv_timeout(timeout) {
        Err(_) => Err(format!(
            "{kind:?}: no result within {timeout:?} ({n} bytes)"
        )),
        Ok((false, _, _)) => Err(format!("{kind:?}: panicked on {n} bytes")),
        Ok((true, text, peak)) => {
            if peak > alloc_budget(n) {
                return Err(format!(
                    "{kind:?}: {peak} bytes allocated for {n} input bytes"
                ));
            }
            if text.is_some_and(|t| t > TEXT_BUDGET) {
                return Err(format!(
                    "{kind:?}: {text:?} text bytes from {n} input bytes"
                ));
            }
            Ok(())
        }
    }
}

const BLOCKS: &[Block] = &[
    Block::Para("Preface text before any heading."),
    Block::Heading(1, "Installation"),
    Block::Para("Unpack the archive & run the installer."),
    Block::Heading(2, "Requirements"),
    Block::Row(&["Part", "Count"]),
    Block::Row(&["Ferrite core", "2"]),
    Block::Heading(1, "Usage"),
    Block::Para("Press the <green> button twice."),
];

const MARKDOWN: &str = "intro\n# Guide\ntext\n## Install\n```sh\n# not a heading\n```\n~~~\nx\n\
~~~\nSetext\n------\n- item\n  * nested\n> quote\n| a | b |\n|---|---|\n| 1 | 2 |\n\
###### six\n####### seven\n[link](http://x) ![img](y)\n";
const RST: &str = "Title\n=====\n\nbody\n\nSub\n---\nmore\n\n.. code:: python\n\n   x = 1\n\n\
Sub2\n~~~~\n* a\n* b\n";
const ROFF: &str = ".\\\" comment\n.TH FROB 1 2024\n.SH NAME\nfrob \\- twiddle \\fBbits\\fR\n\
.SH SYNOPSIS\n.B frob\n[\\fI\\-v\\fP]\n.SS Options\n.TP\n.BR \\-v \" , \" \\-\\-verbose\n\
Be \\(lqloud\\(rq \\*(Tm \\f(CWcode\\fP \\f[B]b\\f[]\n.PP\n.IP \\(bu 2\nitem\n";
const RENDERED_MAN: &str = "LS(1)        User Commands        LS(1)\n\nNAME\n       ls - list\n\n\
SYNOPSIS\n       ls [OPTION]... [FILE]...\n\nDESCRIPTION\n       List information.\n\n\
SEE ALSO\n       dir(1)\n";
const HTML: &str = "<!DOCTYPE html><html><head><title>T</title><style>p{}</style>\
<script>var x = '<h1>';</script></head><body><h1>Guide</h1><p>Text &amp; more &#x41;</p>\
<h2>Install</h2><ul><li>one<ul><li>two</li></ul></li></ul><table><tr><th>a</th><td colspan=3>b</td>\
</tr><tr><td rowspan=2>c</td></tr></table><pre>  code\n  more</pre><a href='x'>link</a>\
<img alt='pic' src='y'><blockquote>q</blockquote></body></html>";

fn pdf() -> &'static [u8] {
    static PDF: OnceLock<Vec<u8>> = OnceLock::new();
    PDF.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.pdf");
        write_pdf(&p, &["First page text", "Second (page) \\ text", ""]).unwrap();
        std::fs::read(p).unwrap()
    })
}

fn seeds() -> &'static [(DocKind, Vec<u8>)] {
    static SEEDS: OnceLock<Vec<(DocKind, Vec<u8>)>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        vec![
            (DocKind::Markdown, MARKDOWN.as_bytes().to_vec()),
            (DocKind::Rst, RST.as_bytes().to_vec()),
            (DocKind::Man, ROFF.as_bytes().to_vec()),
            (DocKind::Text, RENDERED_MAN.as_bytes().to_vec()),
            (DocKind::Html, HTML.as_bytes().to_vec()),
            (DocKind::Pdf, pdf().to_vec()),
            (DocKind::Docx, docx_bytes(BLOCKS)),
            (DocKind::Odt, odt_bytes(BLOCKS)),
            (DocKind::Epub, epub_bytes(&[BLOCKS])),
        ]
    })
}

/// Sequences that mean something to one of the parsers, or to text handling in general.
const HOSTILE: &[&[u8]] = &[
    b"\0",
    b"\xff\xfe",
    b"\xc0\x80",
    b"\xed\xa0\x80",
    b"\xef\xbb\xbf",
    b"\r",
    b"\r\n\r\n",
    b"\n# ",
    b"\n```",
    b"\n~~~",
    b"\n=====\n",
    b"\n-\n",
    b"#######",
    b"\n.SH ",
    b"\n.SS \"",
    b"\n.TH ",
    b"\n.BR \"",
    b"\\",
    b"\\f",
    b"\\f(",
    b"\\f[",
    b"\\(",
    b"\\*(",
    b"\nNAME\n",
    b"\nDESCRIPTION\n",
    b"<",
    b"<h1>",
    b"</table>",
    b"<td colspan=999999999 rowspan=999999999>",
    b"<pre>",
    b"<![CDATA[",
    b"<!--",
    b"&#xFFFFFFFF;",
    b"&#0;",
    b"\n",
    b"obj",
    b"endobj",
    b"stream\n",
    b"endstream",
    b"<<",
    b">>",
    b"[",
    b"(",
    b"/Length 999999999",
    b"/Length -1",
    b"/Filter /FlateDecode",
    b"/Count 999999999",
    b"0 0 R",
    b"xref\n0 999999999\n",
    b"trailer",
    b"startxref\n0\n",
    b"%%EOF",
    b"PK\x03\x04",
    b"PK\x05\x06",
];

#[derive(Debug, Clone)]
enum Mutation {
    /// Keep this fraction of the bytes.
    Truncate(f64),
    /// XOR the byte at this fraction of the length.
    Flip(f64, u8),
    /// Insert a hostile sequence (repeated) at this fraction of the length.
    Insert(f64, usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (0.0f64..1.0).prop_map(Mutation::Truncate),
        (0.0f64..1.0, 1u8..=255).prop_map(|(p, x)| Mutation::Flip(p, x)),
        (
            0.0f64..1.0,
            0..HOSTILE.len(),
            prop_oneof![Just(1usize), 1usize..64]
        )
            .prop_map(|(p, h, r)| Mutation::Insert(p, h, r)),
    ]
}

fn apply(mut b: Vec<u8>, muts: &[Mutation]) -> Vec<u8> {
    let at = |p: f64, len: usize| ((p * len as f64) as usize).min(len);
    for m in muts {
        match *m {
            Mutation::Truncate(p) => b.truncate(at(p, b.len())),
            Mutation::Flip(p, x) if !b.is_empty() => {
                let i = at(p, b.len() - 1);
                b[i] ^= x;
            }
            Mutation::Flip(..) => {}
            Mutation::Insert(p, h, r) => {
                let i = at(p, b.len());
                let ins = HOSTILE[h].repeat(r);
                b.splice(i..i, ins);
            }
        }
    }
    b
}

const KINDS: [DocKind; 10] = [
    DocKind::Markdown,
    DocKind::Rst,
    DocKind::Text,
    DocKind::Code,
    DocKind::Man,
    DocKind::Html,
    DocKind::Pdf,
    DocKind::Docx,
    DocKind::Odt,
    DocKind::Epub,
];

proptest! {
    #![proptest_config(config())]

    /// Random bytes as every kind (the detector never sends most of these, but a file's
    /// name decides its kind, so any bytes can reach any parser).
    #[test]
    fn random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..4096)) {
        for kind in KINDS {
            if let Err(e) = check(kind, bytes.clone()) {
                prop_assert!(false, "{e}");
            }
        }
    }

    /// Random sequences of the hostile pieces, as every kind.
    #[test]
    fn hostile_soup(pieces in prop::collection::vec((0..HOSTILE.len(), 1usize..8), 0..200)) {
        let bytes: Vec<u8> = pieces.iter().flat_map(|&(h, r)| HOSTILE[h].repeat(r)).collect();
        for kind in KINDS {
            if let Err(e) = check(kind, bytes.clone()) {
                prop_assert!(false, "{e}");
            }
        }
    }

    /// A valid document of each kind, truncated, bit-flipped and with hostile sequences
    /// inserted.
    #[test]
    fn mutated_documents(
        seed in 0usize..9,
        muts in prop::collection::vec(mutation(), 1..6),
    ) {
        let (kind, base) = &seeds()[seed];
        let bytes = apply(base.clone(), &muts);
        if let Err(e) = check(*kind, bytes) {
            prop_assert!(false, "{e} after {muts:?}");
        }
    }
}

#[test]
fn seeds_parse_to_text() {
    for (kind, bytes) in seeds() {
        let doc = parse_bytes(*kind, bytes).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        assert!(!doc.is_empty(), "{kind:?}");
        check(*kind, bytes.clone()).unwrap();
    }
}

/// The harness itself catches what it claims to: a panic, a hang, an allocation past the
/// budget and text past its budget are all reported.
#[test]
fn harness_detects_panics_hangs_and_allocations() {
    fn panics(_: DocKind, _: &[u8]) -> Result<ParsedDoc, String> {
        panic!("parser bug")
    }
    fn hangs(_: DocKind, _: &[u8]) -> Result<ParsedDoc, String> {
        std::thread::sleep(Duration::from_secs(3600));
        Err("unreachable".into())
    }
    fn allocates(_: DocKind, _: &[u8]) -> Result<ParsedDoc, String> {
        let v = vec![1u8; alloc_budget(0) + 1];
        Err(format!("{}", std::hint::black_box(v).len()))
    }
    fn expands(kind: DocKind, _: &[u8]) -> Result<ParsedDoc, String> {
        let line = corpus_tools::Line {
            number: 1,
            text: "a".repeat(TEXT_BUDGET),
        };
        Ok(ParsedDoc {
            kind,
            has_line_numbers: true,
            sections: vec![corpus_tools::Section {
                lines: vec![line],
                ..Default::default()
            }],
        })
    }
    fn fails(_: DocKind, _: &[u8]) -> Result<ParsedDoc, String> {
        let v = vec![1u8; 1 << 20];
        Err(format!("corrupt {}", std::hint::black_box(v).len()))
    }
    let run = |f: ParseFn, t: u64| check_with(f, Duration::from_secs(t), DocKind::Text, vec![]);
    assert!(run(panics, 60).unwrap_err().contains("panicked"));
    assert!(run(hangs, 1).unwrap_err().contains("no result within"));
    assert!(run(allocates, 60).unwrap_err().contains("bytes allocated"));
    assert!(run(expands, 60).unwrap_err().contains("text bytes"));
    run(fails, 60).unwrap();
}

/// A PDF whose one page's content stream is `content` deflated.
fn pdf_with_deflated_content(content: &[u8]) -> Vec<u8> {
    use lopdf::{dictionary, Document, Object, Stream};
    use std::io::Write;
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    z.write_all(content).unwrap();
    let packed = z.finish().unwrap();
    let mut doc = Document::with_version("1.5");
    let pages_id = doc.new_object_id();
    let stream =
        Stream::new(dictionary! {"Filter" => "FlateDecode"}, packed).with_compression(false);
    let content_id = doc.add_object(stream);
    let font_id = doc
        .add_object(dictionary! {"Type" => "Font", "Subtype" => "Type1", "BaseFont" => "Courier"});
    let resources_id = doc.add_object(dictionary! {"Font" => dictionary! {"F1" => font_id}});
    let page_id = doc.add_object(dictionary! {
        "Type" => "Page", "Parent" => pages_id, "Contents" => content_id,
    });
    doc.objects.insert(
        pages_id,
        Object::Dictionary(dictionary! {
            "Type" => "Pages", "Kids" => vec![page_id.into()], "Count" => 1,
            "Resources" => resources_id,
            "MediaBox" => vec![0.into(), 0.into(), 595.into(), 842.into()],
        }),
    );
    let catalog_id = doc.add_object(dictionary! {"Type" => "Catalog", "Pages" => pages_id});
    doc.trailer.set("Root", catalog_id);
    let mut out = Vec::new();
    doc.save_to(&mut out).unwrap();
    out
}

/// A deflate bomb: a page whose ~0.25 MB content stream inflates to 256 MiB (lopdf alone
/// takes ~3x that).
#[test]
fn pdf_decompression_bomb_is_bounded() {
    let bomb = pdf_with_deflated_content(&vec![b' '; 256 << 20]);
    assert!(bomb.len() < 2 << 20, "{}", bomb.len());
    check(DocKind::Pdf, bomb).unwrap();
}

/// Deep nesting, where a recursive parser would overflow its stack (which aborts the whole
/// process, isolation thread or not) and html5ever's tree builder takes time quadratic in
/// the depth: refused past a depth (html.rs) before either runs.
#[test]
fn deep_nesting_is_bounded() {
    let depth = 200_000;
    for page in [
        "<div>".repeat(depth) + "x" + &"</div>".repeat(depth),
        "<ul><li>".repeat(depth),
        "<table><tr><td>".repeat(depth),
        "<b><i>".repeat(depth),
        "<font>x".repeat(depth),
    ] {
        check(DocKind::Html, page.into_bytes()).unwrap();
    }
}

#[test]
fn deep_pdf_objects_are_bounded() {
    let depth = 200_000;
    let mut arrays = pdf().to_vec();
    let at = arrays.windows(6).position(|w| w == b"endobj").unwrap();
    arrays.splice(at..at, "[".repeat(depth).into_bytes());
    check(DocKind::Pdf, arrays).unwrap();
    let mut dicts = pdf().to_vec();
    dicts.splice(at..at, "<</A ".repeat(depth).into_bytes());
    check(DocKind::Pdf, dicts).unwrap();
}

#[test]
fn deep_pdf_content_is_bounded() {
    let depth = 200_000;
    let content = pdf_with_deflated_content(&b"[".repeat(depth));
    check(DocKind::Pdf, content).unwrap();
    let q = pdf_with_deflated_content(&b"q ".repeat(depth));
    check(DocKind::Pdf, q).unwrap();
}

/// The same bomb as LZW, and deflated twice (`[/FlateDecode /FlateDecode]`).
#[test]
fn pdf_lzw_and_chained_bombs_are_bounded() {
    let big = vec![b' '; 256 << 20];
    let lzw = weezl::encode::Encoder::with_tiff_size_switch(weezl::BitOrder::Msb, 8)
        .encode(&big)
        .unwrap();
    let mut doc = lopdf::Document::load_mem(&pdf_with_deflated_content(b"BT ET")).unwrap();
    let (id, _) = doc
        .objects
        .iter()
        .find(|(_, o)| o.as_stream().is_ok())
        .map(|(id, o)| (*id, o.clone()))
        .unwrap();
    let set = |doc: &mut lopdf::Document, filter: lopdf::Object, content: Vec<u8>| {
        let s = doc.get_object_mut(id).unwrap().as_stream_mut().unwrap();
        s.dict.set("Filter", filter);
        s.set_content(content);
        let mut out = Vec::new();
        doc.save_to(&mut out).unwrap();
        out
    };
    let lzw_pdf = set(&mut doc, "LZWDecode".into(), lzw);
    check(DocKind::Pdf, lzw_pdf).unwrap();
    let inner = {
        use std::io::Write;
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(&big).unwrap();
        let once = z.finish().unwrap();
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(&once).unwrap();
        z.finish().unwrap()
    };
    let twice = set(
        &mut doc,
        vec!["FlateDecode".into(), "FlateDecode".into()].into(),
        inner,
    );
    assert!(twice.len() < 64 << 10, "{}", twice.len());
    check(DocKind::Pdf, twice).unwrap();
}

/// Text that really is in a PDF is still read when its content is compressed, and a
/// content stream within the limit still counts.
#[test]
fn compressed_pdf_text_is_read() {
    let pdf = pdf_with_deflated_content(b"BT /F1 12 Tf 50 700 Td (Deflated page text) Tj ET");
    let doc = parse_bytes(DocKind::Pdf, &pdf).unwrap();
    let text: Vec<&str> = doc.sections[0]
        .lines
        .iter()
        .map(|l| l.text.as_str())
        .collect();
    assert_eq!(text, ["Deflated page text"]);
}
