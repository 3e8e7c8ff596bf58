//! A real HDFS on loopback: Hadoop's MiniDFSCluster (one namenode and two datanodes, the
//! same server code a Hadoop cluster runs, replication 2, permissions on), started by the
//! launcher `scripts/install-hdfs.sh` builds (`primus-minihdfs`, source in
//! `libs/testkit/hdfs`). The cluster runs as the HDFS superuser `hdfs`; tests are clients
//! under their own user name, so a folder they do not own refuses them as it would on a
//! real cluster.
//!
//! [`Hdfs::start_secured`] runs it under Kerberos (a MiniKdc on loopback, keytabs made at
//! start). The launcher takes commands on its stdin (stop or start a datanode or the namenode,
//! make a folder, set a space quota) and shuts the cluster down and deletes its files on
//! SIGTERM or when stdin closes, so even the shared instance, which is never dropped, leaves
//! nothing behind when its test binary exits.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use crate::process::{Error, Guarded, find_binary, restartable_port, wait_for_start};

const LAUNCHER: &str = "primus-minihdfs";
const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// A restarted namenode leaves safe mode once the datanodes report their blocks again.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);
/// The user the cluster runs as: its superuser.
const SUPERUSER: &str = "hdfs";

/// A running HDFS: a namenode on `127.0.0.1:<port>` and two datanodes.
pub struct Hdfs {
    port: u16,
    client_user: String,
    kerberos: Option<Kerberos>,
    control: Mutex<Control>,
    dir: PathBuf,
    _process: Guarded,
}

/// How a client authenticates to a secured cluster ([`Hdfs::start_secured`]).
#[derive(Debug, Clone)]
pub struct Kerberos {
    /// The client's principal, `<user>@<realm>`.
    pub principal: String,
    /// Its keytab.
    pub keytab: PathBuf,
    /// The KDC's `krb5.conf` (for `KRB5_CONFIG`).
    pub krb5_conf: PathBuf,
}

struct Control {
    stdin: ChildStdin,
    answers: Receiver<String>,
}

impl Hdfs {
    /// The one instance of this test binary, started on first use.
    pub fn shared() -> Result<&'static Hdfs, Error> {
        static SHARED: OnceLock<Result<Hdfs, String>> = OnceLock::new();
        SHARED
            .get_or_init(|| Hdfs::start().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|detail| Error::FailedEarlier {
                what: "hdfs (shared)".into(),
                detail: detail.clone(),
            })
    }

    /// A new cluster on a free port; `/data` belongs to the user the tests run as.
    pub fn start() -> Result<Self, Error> {
        Self::launch(None)
    }

    /// A new cluster secured as a production one is over RPC: a KDC on loopback, the
    /// namenode and datanodes authenticating with keytabs, block access tokens and SASL
    /// on data transfer (`dfs.data.transfer.protection=authentication`). `/data` belongs to
    /// `user`, whose principal and keytab [`Hdfs::kerberos`] gives.
    pub fn start_secured(user: &str) -> Result<Self, Error> {
        Self::launch(Some(user))
    }

    fn launch(kerberos_user: Option<&str>) -> Result<Self, Error> {
        let launcher = find_binary(LAUNCHER).map_err(|_| Error::MissingBinary {
            binary: LAUNCHER.into(),
            tools: "$CLUSTER_TOOLS_DIR/bin (~/.cache/primus-rs/tools/bin)".into(),
            install: "./scripts/install-hdfs.sh".into(),
        })?;
        let port = restartable_port()?;
        let dir = std::env::temp_dir().join(format!("primus-hdfs-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(Error::io(format!("create {}", dir.display())))?;
        let log = dir.join("launcher.log");
        let mut command = Command::new(&launcher);
        command
            .arg(format!("--base={}", dir.display()))
            .arg(format!("--namenode-port={port}"));
        if let Some(user) = kerberos_user {
            command.arg(format!("--kerberos={user}"));
        }
        let mut child = command
            .env("HADOOP_USER_NAME", SUPERUSER)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(
                std::fs::File::create(&log)
                    .map(Stdio::from)
                    .map_err(Error::io(format!("create {}", log.display())))?,
            )
            .spawn()
            .map_err(Error::io(format!("start {}", launcher.display())))?;
        let (stdin, stdout) = match (child.stdin.take(), child.stdout.take()) {
            (Some(stdin), Some(stdout)) => (stdin, stdout),
            _ => {
                return Err(Error::io("pipe to the HDFS launcher")(
                    std::io::Error::other("no pipe"),
                ));
            }
        };
        let mut process = Guarded::with_stop_signal(child);
        let (sender, answers) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let mut ready = String::new();
        let started = wait_for_start(
            "hdfs",
            READY_TIMEOUT,
            &mut process,
            std::slice::from_ref(&log),
            || match answers.try_recv() {
                Ok(line) if line.starts_with("ready ") => {
                    ready = line;
                    Ok(())
                }
                Ok(line) => Err(format!("unexpected line from the launcher: {line}")),
                Err(_) => Err("the namenode and datanodes are starting".into()),
            },
        );
        if let Err(error) = started {
            // The error holds the end of the log; a launcher that died leaves its folder.
            drop(process);
            let _ = std::fs::remove_dir_all(&dir);
            return Err(error);
        }
        // `ready <port> <realm>` for a secured cluster.
        let kerberos = match (kerberos_user, ready.split_whitespace().nth(2)) {
            (Some(user), Some(realm)) => Some(Kerberos {
                principal: format!("{user}@{realm}"),
                keytab: dir.join("client.keytab"),
                krb5_conf: dir.join("krb5.conf"),
            }),
            (Some(_), None) => {
                return Err(Error::Unsupported {
                    what: "hdfs (secured)".into(),
                    detail: format!("the launcher named no Kerberos realm: {ready:?}"),
                });
            }
            (None, _) => None,
        };
        let hdfs = Self {
            port,
            client_user: kerberos_user.map_or_else(client_user, str::to_owned),
            kerberos,
            control: Mutex::new(Control { stdin, answers }),
            dir,
            _process: process,
        };
        hdfs.command(&format!("mkdir /data {} 755", hdfs.client_user))?;
        Ok(hdfs)
    }

    /// `hdfs://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("hdfs://127.0.0.1:{}", self.port)
    }

    /// The namenode's RPC port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A secured cluster's client credentials ([`Hdfs::start_secured`]).
    pub fn kerberos(&self) -> Option<&Kerberos> {
        self.kerberos.as_ref()
    }

    /// The user the tests' clients are (`HADOOP_USER_NAME`, else the process's user; on a
    /// secured cluster the user of the client principal).
    pub fn client_user(&self) -> &str {
        &self.client_user
    }

    /// A new empty folder under `/data` owned by the tests' user, as a full `hdfs://` URL.
    pub fn folder(&self, hint: &str) -> Result<String, Error> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let path = format!(
            "/data/{hint}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        self.make_folder(&path, &self.client_user.clone(), 0o755)?;
        Ok(format!("{}{path}", self.url()))
    }

    /// Makes `path` (and its parents) owned by `owner` with permission bits `mode`.
    pub fn make_folder(&self, path: &str, owner: &str, mode: u32) -> Result<(), Error> {
        self.command(&format!("mkdir {path} {owner} {mode:o}"))
    }

    /// Stops datanode `index` (0 or 1); its blocks stay on disk for [`Self::start_datanode`].
    pub fn stop_datanode(&self, index: usize) -> Result<(), Error> {
        self.command(&format!("stop-datanode {index}"))
    }

    /// Starts a stopped datanode again on its old ports.
    pub fn start_datanode(&self, index: usize) -> Result<(), Error> {
        self.command(&format!("start-datanode {index}"))
    }

    /// Stops the namenode; clients' calls fail until [`Self::start_namenode`].
    pub fn stop_namenode(&self) -> Result<(), Error> {
        self.command("stop-namenode")
    }

    /// Starts the namenode again on the same port with the same metadata; returns once it
    /// is active.
    pub fn start_namenode(&self) -> Result<(), Error> {
        self.command("start-namenode")
    }

    /// Caps the bytes (all replicas counted) under `path`: a write beyond it fails as on a
    /// full file system.
    pub fn set_space_quota(&self, path: &str, bytes: u64) -> Result<(), Error> {
        self.command(&format!("quota {path} {bytes}"))
    }

    /// Removes the cap of [`Self::set_space_quota`].
    pub fn clear_space_quota(&self, path: &str) -> Result<(), Error> {
        self.command(&format!("clear-quota {path}"))
    }

    /// The folder the namenode and datanodes keep their files in.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    fn command(&self, line: &str) -> Result<(), Error> {
        let failed = |detail: String| Error::Command {
            command: format!("{LAUNCHER} {line}"),
            status: "refused".into(),
            stderr: detail,
        };
        let mut control = self.control.lock().unwrap_or_else(PoisonError::into_inner);
        writeln!(control.stdin, "{line}")
            .and_then(|()| control.stdin.flush())
            .map_err(Error::io(format!("send `{line}` to {LAUNCHER}")))?;
        match control.answers.recv_timeout(COMMAND_TIMEOUT) {
            Ok(answer) if answer == "ok" => Ok(()),
            Ok(answer) => Err(failed(answer)),
            Err(RecvTimeoutError::Timeout) => {
                Err(failed(format!("no answer within {COMMAND_TIMEOUT:?}")))
            }
            Err(RecvTimeoutError::Disconnected) => Err(failed("the launcher exited".into())),
        }
    }
}

#[expect(
    clippy::disallowed_methods,
    reason = "the HDFS client names its user from HADOOP_USER_NAME; the testkit must agree"
)]
fn client_user() -> String {
    std::env::var("HADOOP_USER_NAME")
        .ok()
        .filter(|name| !name.is_empty())
        .or_else(|| {
            let out = Command::new("id").arg("-un").output().ok()?;
            let name = String::from_utf8(out.stdout).ok()?.trim().to_owned();
            (!name.is_empty()).then_some(name)
        })
        .unwrap_or_else(|| "root".into())
}
