//! primus-storage against a Kerberos-secured HDFS (the testkit's secured MiniDFSCluster: a
//! KDC on loopback, block access tokens, SASL on data transfer): a client with the keytab
//! named in `storage.hdfs.*` writes and reads; a wrong keytab is refused and a missing one
//! named. The KDC is found through `KRB5_CONFIG`, which this crate cannot set in its own
//! process (`unsafe` is forbidden), so the test runs itself again as a child with it.
#![cfg(feature = "hdfs")]
#![expect(
    clippy::disallowed_methods,
    reason = "the test runs itself again and hands the child the cluster by variables"
)]

use std::path::PathBuf;

use primus_config::StorageSettings;
use primus_storage::{StorageError, open};
use primus_testkit::{Hdfs, run_test_again};

/// Set in the child run: the cluster's folder URL, the principal and keytabs.
const URL: &str = "PRIMUS_TEST_HDFS_URL";
const PRINCIPAL: &str = "PRIMUS_TEST_HDFS_PRINCIPAL";
const KEYTAB: &str = "PRIMUS_TEST_HDFS_KEYTAB";
const WRONG_KEYTAB: &str = "PRIMUS_TEST_HDFS_WRONG_KEYTAB";

#[test]
fn a_secured_cluster_takes_the_keytab_in_the_settings_and_refuses_a_wrong_one() {
    if std::env::var_os(URL).is_some() {
        tokio::runtime::Runtime::new()
            .expect("runtime")
            .block_on(check_secured_cluster());
        return;
    }
    let hdfs = Hdfs::start_secured("primus").expect("a secured hdfs");
    let kerberos = hdfs.kerberos().expect("Kerberos credentials").clone();
    let url = hdfs.folder("secured").expect("folder");
    // Another cluster's keytab for the same principal name: the KDC of this one refuses it.
    let other = Hdfs::start_secured("primus").expect("another secured hdfs");
    let wrong_keytab = other.kerberos().expect("credentials").keytab.clone();
    run_test_again(
        "a_secured_cluster_takes_the_keytab_in_the_settings_and_refuses_a_wrong_one",
        &[
            ("KRB5_CONFIG", kerberos.krb5_conf.as_os_str()),
            (URL, url.as_ref()),
            (PRINCIPAL, kerberos.principal.as_ref()),
            (KEYTAB, kerberos.keytab.as_os_str()),
            (WRONG_KEYTAB, wrong_keytab.as_os_str()),
        ],
        &["KRB5CCNAME"],
    );
}

fn settings(principal: Option<&str>, keytab: Option<PathBuf>) -> StorageSettings {
    let mut settings = StorageSettings::default();
    settings.hdfs.kerberos_principal = principal.map(str::to_owned);
    settings.hdfs.kerberos_keytab = keytab;
    settings.hdfs.config.insert(
        "dfs.data.transfer.protection".into(),
        "authentication".into(),
    );
    settings
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is set by the parent run"))
}

async fn check_secured_cluster() {
    let url = var(URL);
    let principal = var(PRINCIPAL);
    let keytab = PathBuf::from(var(KEYTAB));

    let location = open(&url, &settings(Some(&principal), Some(keytab.clone()))).expect("open");
    let path = location.path("model/shard-0.bin");
    let bytes: Vec<u8> = (0..=255u8).cycle().take(2 * 1024 * 1024).collect();
    location
        .put(&path, bytes.clone().into())
        .await
        .expect("written with the keytab");
    assert_eq!(location.get(&path).await.expect("read").to_vec(), bytes);
    assert_eq!(location.list("").await.expect("list").len(), 1);

    let wrong = open(
        &url,
        &settings(Some(&principal), Some(PathBuf::from(var(WRONG_KEYTAB)))),
    )
    .expect("open");
    let err = wrong.list("").await.expect_err("another KDC's key");
    assert!(matches!(err, StorageError::Denied { .. }), "{err}");
    eprintln!("a wrong keytab: {err}");

    let missing = keytab.with_file_name("missing.keytab");
    let err = open(&url, &settings(Some(&principal), Some(missing.clone())))
        .expect_err("no keytab there");
    let message = err.to_string();
    assert!(
        message.contains("storage.hdfs.kerberos_keytab") && message.contains("missing.keytab"),
        "{message}"
    );

    let err = open(&url, &settings(None, Some(keytab))).expect_err("a keytab without principal");
    assert!(
        err.to_string().contains("storage.hdfs.kerberos_principal"),
        "{err}"
    );
}
