//! `primus import` as a user runs it: the summary on success, the file named on failure.

use std::path::Path;
use std::process::Command;

fn primus() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_primus"))
}

#[test]
fn import_movielens_prints_what_it_wrote_and_names_a_missing_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = dir.path().join("ml-100k");
    std::fs::create_dir(&source).expect("dir");
    let files = [
        (
            "ml-100k.inter",
            "user_id:token\titem_id:token\trating:float\ttimestamp:float\n1\t7\t4\t874713650\n1\t7\t2\t874800000\n",
        ),
        (
            "ml-100k.user",
            "user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token\n1\t30\tF\twriter\t10001\n",
        ),
        (
            "ml-100k.item",
            "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n7\tHeat\t1995\tAction Crime\n",
        ),
    ];
    for (name, text) in files {
        std::fs::write(source.join(name), text).expect("write");
    }
    let out = dir.path().join("out");
    let import = || {
        Command::new(primus())
            .args(["import", "movielens", "--from"])
            .arg(&source)
            .arg("--out")
            .arg(&out)
            .output()
            .expect("run primus")
    };
    let run = import();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{run:?}");
    assert!(
        stdout.contains("wrote 2 ratings (1 with rating >= 4) in 2 daily files"),
        "{stdout}"
    );
    assert!(out.join("date=1997-09-21/part-00000.parquet").is_file());

    std::fs::remove_file(source.join("ml-100k.user")).expect("remove");
    let run = import();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("ml-100k.user"), "{stderr}");
}
