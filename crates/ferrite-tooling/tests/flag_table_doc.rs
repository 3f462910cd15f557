//! `docs/flags.md` shows `ferrite_tooling::flag_table::FLAGS` as it is:
//! the text between the table markers must equal `flag_table::markdown()`.
//! Run with `FERRITE_BLESS=1` to rewrite the table after changing a row.

use std::path::PathBuf;

const BEGIN: &str =
    "<!-- flag table: generated from crates/ferrite-tooling/src/flag_table.rs -->\n";
const END: &str = "<!-- end of flag table -->\n";

#[test]
fn docs_flags_md_matches_the_table() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/flags.md");
    let doc = std::fs::read_to_string(&path).expect("reading docs/flags.md");
    let (Some(b), Some(e)) = (doc.find(BEGIN), doc.find(END)) else {
        panic!(
            "docs/flags.md lacks the table markers `{}` and `{}`",
            BEGIN.trim(),
            END.trim()
        );
    };
    let table = &doc[b + BEGIN.len()..e];
    let want = ferrite_tooling::flag_table::markdown();
    if table == want {
        return;
    }
    if std::env::var_os("FERRITE_BLESS").is_some() {
        let text = format!("{}{want}{}", &doc[..b + BEGIN.len()], &doc[e..]);
        std::fs::write(&path, text).expect("writing docs/flags.md");
        return;
    }
    panic!("docs/flags.md's table differs from flag_table::FLAGS; run `FERRITE_BLESS=1 cargo test -p ferrite-tooling --test flag_table_doc`");
}
