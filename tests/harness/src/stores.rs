//! Object stores as tests and benchmarks use them: the storage settings that open a
//! testkit S3 bucket, and a copy of every file from one location to another.

use primus_config::StorageSettings;
use primus_storage::{Location, ObjectPath};
use primus_testkit::S3Bucket;

/// Storage settings that open `bucket` (its endpoint, region and keys, plain HTTP).
pub fn s3_settings(bucket: &S3Bucket) -> StorageSettings {
    let mut settings = StorageSettings::default();
    settings.s3.endpoint = Some(bucket.endpoint.clone());
    settings.s3.region = Some(S3Bucket::REGION.into());
    settings.s3.access_key_id = Some(S3Bucket::ACCESS_KEY.into());
    settings.s3.secret_access_key = Some(S3Bucket::SECRET_KEY.into());
    settings.s3.allow_http = true;
    settings
}

/// `path` relative to `location`'s prefix (`a/b.parquet`).
pub fn relative(location: &Location, path: &ObjectPath) -> String {
    (path.prefix_match(location.prefix()))
        .expect("a path under the location")
        .map(|part| part.as_ref().to_owned())
        .collect::<Vec<_>>()
        .join("/")
}

/// Copies every file under `from` to the same relative path under `to`.
pub async fn copy_files(from: &Location, to: &Location) {
    for file in from.list("").await.expect("list the files to copy") {
        let bytes = from.get(&file.location).await.expect("read");
        to.put(&to.path(&relative(from, &file.location)), bytes)
            .await
            .expect("write the copy");
    }
}
