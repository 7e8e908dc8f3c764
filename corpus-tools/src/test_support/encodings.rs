//! A corpus written from known text through encoding_rs's encoders: every encoding the
//! decoder handles, with and without BOM, mixed CRLF/LF line endings and a few corrupt
//! bytes; each file holds one word (accented, Cyrillic, Greek or CJK) on a known line.
//! Plus real binary headers that must stay skipped.

use encoding_rs::Encoding;
use std::path::Path;

/// One file of the corpus and what a search for `word` must find.
#[derive(Debug, Clone)]
pub struct EncodedFile {
    pub name: String,
    /// The encoding it was written in (`UTF-16LE`, `Shift_JIS`, ...).
    pub encoding: &'static str,
    pub bom: bool,
    /// Invalid sequences written into it on purpose (each becomes one U+FFFD).
    pub corrupt: usize,
    /// A word that occurs in this file only, on line `line` (1-based; HTML: no line).
    pub word: &'static str,
    pub line: Option<u32>,
}

/// Sentences per language (long enough for detection) and the line that holds the word.
struct Lang {
    filler: [&'static str; 4],
    key: &'static str,
}

const FR: Lang = Lang {
    filler: [
        "Ce document décrit la procédure à suivre après la réunion du comité.",
        "Les employés doivent vérifier les accès et signaler toute anomalie détectée.",
        "La sécurité du bâtiment est assurée par une équipe très compétente.",
        "Après vérification, le rapport est envoyé au responsable régional.",
    ],
    key: "Le mot à retenir ici est \"{}\", noté à côté.",
};
const DE: Lang = Lang {
    filler: [
        "Dieses Dokument beschreibt das Verfahren nach der Sitzung des Ausschusses.",
        "Die Mitarbeiter müssen die Zugänge prüfen und jede Störung melden.",
        "Die Sicherheit des Gebäudes wird von einem sehr fähigen Team gewährleistet.",
        "Nach der Überprüfung wird der Bericht an den regionalen Leiter geschickt.",
    ],
    key: "Das Wort, das man sich merken muss, heißt \"{}\".",
};
const PL: Lang = Lang {
    filler: [
        "Ten dokument opisuje procedurę po posiedzeniu komitetu.",
        "Pracownicy muszą sprawdzić dostęp i zgłosić każdą nieprawidłowość.",
        "Bezpieczeństwo budynku zapewnia bardzo kompetentny zespół.",
        "Po weryfikacji raport jest wysyłany do kierownika regionalnego.",
    ],
    key: "Słowo do zapamiętania to \"{}\".",
};
const EL: Lang = Lang {
    filler: [
        "Αυτό το έγγραφο περιγράφει τη διαδικασία μετά τη συνεδρίαση της επιτροπής.",
        "Οι υπάλληλοι πρέπει να ελέγξουν την πρόσβαση και να αναφέρουν κάθε πρόβλημα.",
        "Η ασφάλεια του κτιρίου εξασφαλίζεται από μια πολύ ικανή ομάδα.",
        "Μετά τον έλεγχο, η αναφορά αποστέλλεται στον περιφερειακό υπεύθυνο.",
    ],
    key: "Η λέξη που πρέπει να θυμάστε είναι \"{}\".",
};
const RU: Lang = Lang {
    filler: [
        "Этот документ описывает порядок действий после заседания комитета.",
        "Сотрудники должны проверить доступ и сообщить о любых нарушениях.",
        "Безопасность здания обеспечивает очень опытная команда.",
        "После проверки отчёт отправляется региональному руководителю.",
    ],
    key: "Слово, которое нужно запомнить: \"{}\".",
};
const JA: Lang = Lang {
    filler: [
        "この文書は、会議の後の手順について説明します。",
        "社員は、アクセス権を確認して、問題があれば報告してください。",
        "建物の安全は、とても有能なチームが担当しています。",
        "確認の後で、報告書は地域の責任者に送られます。",
    ],
    key: "覚えておく言葉は「{}」です。",
};
const ZH_HANS: Lang = Lang {
    filler: [
        "本文件说明了会议之后应当遵循的程序。",
        "员工必须检查访问权限，并报告任何异常情况。",
        "大楼的安全由一支非常专业的团队负责。",
        "核实之后，报告将发送给地区负责人。",
    ],
    key: "需要记住的词是「{}」。",
};
const ZH_HANT: Lang = Lang {
    filler: [
        "本文件說明了會議之後應當遵循的程序。",
        "員工必須檢查存取權限，並報告任何異常情況。",
        "大樓的安全由一支非常專業的團隊負責。",
        "核實之後，報告將發送給地區負責人。",
    ],
    key: "需要記住的詞是「{}」。",
};
const KO: Lang = Lang {
    filler: [
        "이 문서는 회의 후에 따라야 할 절차를 설명합니다.",
        "직원들은 접근 권한을 확인하고 이상이 있으면 보고해야 합니다.",
        "건물의 보안은 매우 유능한 팀이 담당합니다.",
        "확인 후 보고서는 지역 책임자에게 전송됩니다.",
    ],
    key: "기억할 단어는 「{}」 입니다.",
};

/// How a file is written.
#[derive(Clone, Copy)]
enum Form {
    /// encoding_rs's encoder (ASCII-compatible encodings).
    Legacy(&'static Encoding),
    Utf16 {
        big_endian: bool,
    },
}

struct Spec {
    name: &'static str,
    form: Form,
    bom: bool,
    lang: &'static Lang,
    word: &'static str,
    /// Byte strings spliced into the encoded text at the end of lines 4 and 5; each must
    /// decode as exactly one U+FFFD.
    corrupt: &'static [&'static [u8]],
}

fn specs() -> Vec<Spec> {
    use encoding_rs::*;
    let s = |name, form, bom, lang, word| Spec {
        name,
        form,
        bom,
        lang,
        word,
        corrupt: &[],
    };
    let le = Form::Utf16 { big_endian: false };
    let be = Form::Utf16 { big_endian: true };
    vec![
        s("utf8.md", Form::Legacy(UTF_8), false, &FR, "éphémère"),
        s("utf8-bom.md", Form::Legacy(UTF_8), true, &FR, "forêt"),
        Spec {
            corrupt: &[b"\xff", b"\xc3"],
            ..s("utf8-stray.md", Form::Legacy(UTF_8), false, &FR, "hôpital")
        },
        Spec {
            // An unpaired surrogate.
            corrupt: &[b"\x00\xd8"],
            ..s("utf16le-bom.txt", le, true, &FR, "château")
        },
        s("utf16be-bom.txt", be, true, &RU, "справочник"),
        s("utf16le.txt", le, false, &FR, "naïveté"),
        s("utf16be-ja.txt", be, true, &JA, "京都"),
        s(
            "windows-1252.txt",
            Form::Legacy(WINDOWS_1252),
            false,
            &FR,
            "théâtre",
        ),
        s(
            "iso-8859-1.txt",
            Form::Legacy(WINDOWS_1252),
            false,
            &DE,
            "Größenänderung",
        ),
        s(
            "iso-8859-2.txt",
            Form::Legacy(ISO_8859_2),
            false,
            &PL,
            "źdźbło",
        ),
        s(
            "iso-8859-7.txt",
            Form::Legacy(ISO_8859_7),
            false,
            &EL,
            "θάλασσα",
        ),
        s(
            "koi8-r.txt",
            Form::Legacy(KOI8_R),
            false,
            &RU,
            "электричество",
        ),
        s(
            "windows-1251.txt",
            Form::Legacy(WINDOWS_1251),
            false,
            &RU,
            "библиотека",
        ),
        Spec {
            corrupt: &[b"\x81", b"\xfd"],
            ..s("shift_jis.txt", Form::Legacy(SHIFT_JIS), false, &JA, "札幌")
        },
        s("euc-jp.txt", Form::Legacy(EUC_JP), false, &JA, "名古屋"),
        s(
            "iso-2022-jp.txt",
            Form::Legacy(ISO_2022_JP),
            false,
            &JA,
            "横浜",
        ),
        Spec {
            corrupt: &[b"\x81", b"\xff"],
            ..s("gbk.txt", Form::Legacy(GBK), false, &ZH_HANS, "北京")
        },
        s("big5.txt", Form::Legacy(BIG5), false, &ZH_HANT, "臺北"),
        Spec {
            corrupt: &[b"\xff"],
            ..s("euc-kr.txt", Form::Legacy(EUC_KR), false, &KO, "서울")
        },
    ]
}

/// The text files of the corpus, in memory: (what to expect, bytes).
pub fn encoding_corpus() -> Vec<(EncodedFile, Vec<u8>)> {
    let mut out = Vec::new();
    for (i, spec) in specs().into_iter().enumerate() {
        // The word's line moves from file to file; line endings alternate CRLF / LF.
        let before = 3 + i % 4;
        let mut lines = vec![format!("Notes {i}"), String::new()];
        lines.extend((0..before).map(|j| spec.lang.filler[j % 4].to_string()));
        lines.push(spec.lang.key.replace("{}", spec.word));
        lines.extend(spec.lang.filler.iter().map(|s| s.to_string()));
        let line = (lines.len() - spec.lang.filler.len()) as u32;
        let mut bytes = Vec::new();
        if spec.bom {
            bytes.extend_from_slice(match spec.form {
                Form::Legacy(_) => b"\xEF\xBB\xBF",
                Form::Utf16 { big_endian: false } => b"\xFF\xFE",
                Form::Utf16 { big_endian: true } => b"\xFE\xFF",
            });
        }
        let mut corrupt = spec.corrupt.iter();
        for (n, l) in lines.iter().enumerate() {
            bytes.extend(encode(spec.form, l));
            // Lines 4 and 5 (never the word's) end in the bad bytes, before the break.
            if n == 3 || n == 4 {
                if let Some(bad) = corrupt.next() {
                    bytes.extend_from_slice(bad);
                }
            }
            bytes.extend(encode(spec.form, if n % 2 == 0 { "\r\n" } else { "\n" }));
        }
        let encoding = match spec.form {
            Form::Legacy(e) => e.name(),
            Form::Utf16 { big_endian: false } => "UTF-16LE",
            Form::Utf16 { big_endian: true } => "UTF-16BE",
        };
        let file = EncodedFile {
            name: spec.name.to_string(),
            encoding,
            bom: spec.bom,
            corrupt: spec.corrupt.len() - corrupt.len(),
            word: spec.word,
            line: Some(line),
        };
        out.push((file, bytes));
    }
    out.extend(declared_files());
    out
}

/// An HTML page that says `<meta charset>`, one with `http-equiv`, and an XML file with an
/// encoding declaration.
fn declared_files() -> Vec<(EncodedFile, Vec<u8>)> {
    let file = |name: &str, encoding, word, line| EncodedFile {
        name: name.to_string(),
        encoding,
        bom: false,
        corrupt: 0,
        word,
        line,
    };
    let sjis = encoding_rs::SHIFT_JIS;
    let html = format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"Shift_JIS\"><title>京都の案内</title></head>\n<body><h1>案内</h1><p>{}</p><p>{}</p></body></html>\n",
        JA.filler[0],
        JA.key.replace("{}", "奈良")
    );
    let cp1251 = encoding_rs::WINDOWS_1251;
    let html2 = format!(
        "<html><head><meta http-equiv=\"Content-Type\" content=\"text/html; charset=windows-1251\"></head>\n<body><p>{}</p><p>{}</p></body></html>\n",
        RU.filler[1],
        RU.key.replace("{}", "самовар")
    );
    let eucjp = encoding_rs::EUC_JP;
    let xml = format!(
        "<?xml version=\"1.0\" encoding=\"EUC-JP\"?>\r\n<notes>\n  <p>{}</p>\r\n  <p>{}</p>\n</notes>\n",
        JA.filler[2],
        JA.key.replace("{}", "大阪")
    );
    vec![
        (
            file("page-sjis.html", "Shift_JIS", "奈良", None),
            encode(Form::Legacy(sjis), &html),
        ),
        (
            file("page-1251.html", "windows-1251", "самовар", None),
            encode(Form::Legacy(cp1251), &html2),
        ),
        (
            file("notes-euc-jp.xml", "EUC-JP", "大阪", Some(4)),
            encode(Form::Legacy(eucjp), &xml),
        ),
    ]
}

fn encode(form: Form, text: &str) -> Vec<u8> {
    match form {
        Form::Legacy(enc) => {
            let (bytes, _, unmappable) = enc.encode(text);
            assert!(!unmappable, "{} cannot encode {text:?}", enc.name());
            bytes.into_owned()
        }
        Form::Utf16 { big_endian } => text
            .encode_utf16()
            .flat_map(|u| {
                if big_endian {
                    u.to_be_bytes()
                } else {
                    u.to_le_bytes()
                }
            })
            .collect(),
    }
}

/// Writes [`encoding_corpus`] into `dir`.
pub fn write_encoding_corpus(dir: &Path) -> std::io::Result<Vec<EncodedFile>> {
    let mut files = Vec::new();
    for (f, bytes) in encoding_corpus() {
        std::fs::write(dir.join(&f.name), bytes)?;
        files.push(f);
    }
    Ok(files)
}

/// Binaries with names that do not give them away, and what detection must call them:
/// (name, bytes, detail).
pub fn binary_files() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let mut png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR\x00\x00\x00\x10\x00\x00\x00\x10\x08\x06\x00\x00\x00".to_vec();
    png.extend_from_slice(b"\x1f\xf3\xffa\x00\x00\x00\x0cIDATx\x9cc\xf8\x0f\x00\x00\x01\x01\x00\x05\x00\x00\x00\x00IEND\xaeB`\x82");
    // An ELF header (x86-64 executable) followed by program headers' worth of zeros.
    let mut elf =
        b"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x3e\x00\x01\x00\x00\x00"
            .to_vec();
    elf.resize(4096, 0);
    vec![
        ("picture", png, "PNG image"),
        ("program", elf, "ELF executable"),
        (
            "bundle",
            stored_zip("readme.txt", b"hello from inside a zip\n"),
            "zip archive",
        ),
        (
            "records.log",
            (0..2048u32).map(|i| (i * 7 % 251) as u8 + 1).collect(),
            "",
        ),
    ]
}

/// A zip archive with one stored (uncompressed) file, as `zip -0` writes it.
fn stored_zip(name: &str, data: &[u8]) -> Vec<u8> {
    let crc = crc32(data);
    let n = name.len() as u16;
    let size = data.len() as u32;
    let mut z = Vec::new();
    let header = |sig: &[u8], z: &mut Vec<u8>| {
        z.extend_from_slice(sig);
        z.extend_from_slice(&[20, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        z.extend_from_slice(&crc.to_le_bytes());
        z.extend_from_slice(&size.to_le_bytes());
        z.extend_from_slice(&size.to_le_bytes());
        z.extend_from_slice(&n.to_le_bytes());
    };
    header(b"PK\x03\x04", &mut z);
    z.extend_from_slice(&0u16.to_le_bytes());
    z.extend_from_slice(name.as_bytes());
    z.extend_from_slice(data);
    let central = z.len() as u32;
    z.extend_from_slice(b"PK\x01\x02\x14\x00");
    let mut c = Vec::new();
    header(b"", &mut c);
    z.extend_from_slice(&c);
    z.extend_from_slice(&[0; 12]); // extra, comment, disk, attributes
    z.extend_from_slice(&0u32.to_le_bytes()); // offset of the local header
    z.extend_from_slice(name.as_bytes());
    let central_len = z.len() as u32 - central;
    z.extend_from_slice(b"PK\x05\x06\x00\x00\x00\x00\x01\x00\x01\x00");
    z.extend_from_slice(&central_len.to_le_bytes());
    z.extend_from_slice(&central.to_le_bytes());
    z.extend_from_slice(&0u16.to_le_bytes());
    z
}

fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}
